"""The fault battery's cases, one declarative entry each: a name, a family, what it does, what the
documentation promises (docs/concepts/resume.md, docs/getting-started/command-line.md), and a function
that sets the fault up in the case's own folder and returns what `fedistill` did."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
from collections.abc import Callable
from pathlib import Path

from fault_harness import (
    SETTINGS,
    TIMEOUT,
    Case,
    Observed,
    Promise,
    Scratch,
    checkpoint,
    checkpoint_reached,
    command,
    flip_last_byte,
    killed_copy,
    mnist_folder,
    nifti,
    png,
    resumed,
    shell,
    started,
    tif5,
    wait_for,
)

RUN = ["run", *SETTINGS["fedavg"], "--out", "runs", "--name", "a"]
CASES: list[Case] = []


def case(name: str, family: str, does: str, promise: Promise) -> Callable:
    def add(run: Callable[[Scratch], Observed]) -> Callable[[Scratch], Observed]:
        CASES.append(Case(name, family, does, promise, run))
        return run

    return add


# --- user mistakes: each named before anything is written -------------------------------------------------
#: Files every mistake case finds in its folder, for the mistakes that name one.
FILES = {
    "bad.toml": "rounds = = 3\n",
    "key.toml": "[fedavg]\nnosuch = 1\n",
    "table.toml": "[nosuch]\nkey = 1\n",
}
DATA = ["run", "--algorithm", "fedavg", "--rounds", "1", "--quiet", "--out", "runs", "--name", "a"]


def mistake(name: str, family: str, does: str, argv: list[str], words: str, lines: int = 1) -> None:
    def run(s: Scratch) -> Observed:
        for file, text in {**FILES, "afile": ""}.items():
            (s.folder / file).write_text(text, encoding="utf-8")
        seen = s.cli(*argv)
        seen.checks["no run folder left"] = not (s.folder / "runs" / "a").exists()
        return seen

    CASES.append(Case(name, family, does, Promise(2, lines=lines, words=words), run))


for _name, _extra, _words in [
    ("unknown-algorithm", ["--algorithm", "fedavgg"], "did you mean 'fedavg'"),
    ("unknown-dataset", ["--dataset", "mnistt"], "did you mean 'mnist'"),
    ("unknown-model", ["--model", "resnet9x"], "resnet9x"),
    ("alpha-zero", ["--partition", "dirichlet", "--alpha", "0"], "alpha"),
    ("lr-infinite", ["--lr", "inf"], "lr must be a finite number"),
    ("clients-zero", ["--clients", "0"], "clients"),
    ("rounds-not-a-number", ["--rounds", "abc"], "--rounds"),
    ("rounds-string", ["--set", "rounds='abc'"], "rounds"),
    ("min-clients-over-clients", ["--set", "min_clients=5"], "min_clients"),
    ("threads-negative", ["--set", "threads=-1"], "threads"),
    ("name-is-a-path", ["--name", "../x"], "one plain folder name"),
    ("key-typo", ["--set", "roundz=3"], "did you mean 'rounds'"),
    ("config-missing", ["--config", "missing.toml"], "does not exist"),
    ("config-unreadable-toml", ["--config", "bad.toml"], "bad.toml"),
    ("config-unknown-table-key", ["--config", "key.toml"], "fedavg.nosuch"),
    ("config-unknown-table", ["--config", "table.toml"], "[nosuch]"),
    ("out-is-a-file", ["--out", "afile"], "cannot write the run directory"),
]:
    _does = " ".join(_extra) + "".join(
        f" ({FILES[a].strip()})".replace("\n", "; ") for a in _extra if a in FILES
    )
    mistake(_name, "config", _does, [*RUN, *_extra], _words)
# the one exception to one line, as tests/test_cli.py pins it: the error, then where each file goes
_argv = ["--dataset", "mnist", "--data-dir", "nothing"]
mistake("mnist-missing-dir", "data", " ".join(_argv), [*DATA, *_argv], "missing dataset files", lines=7)


for _name, _does, _damage in [
    ("mnist-truncated-idx", "MNIST train images cut in half (md5 checked first)", lambda b: b[: len(b) // 2]),
    ("mnist-not-gzip", "MNIST train images replaced by text (md5 checked first)", lambda b: b"not idx"),
]:

    def _run(s: Scratch, damage=_damage) -> Observed:
        mnist_folder(s, damage)
        return s.cli(*DATA, "--dataset", "mnist", "--data-dir", "data")

    CASES.append(Case(_name, "data", _does, Promise(2, words="train-images-idx3-ubyte.gz"), _run))


@case("image-folder-one-class", "data", "an image folder with one class", Promise(2, words="at least 2"))
def _one_class(s: Scratch) -> Observed:
    from PIL import Image

    for split in ("train", "test"):
        (s.folder / "data" / split / "ant").mkdir(parents=True)
        for j in range(3):
            Image.new("RGB", (8, 8), (10 * j, 0, 0)).save(s.folder / "data" / split / "ant" / f"{j}.png")
    return s.cli(*DATA, "--dataset", "image-folder", "--data-dir", "data")


for _dataset, _kind in [("ixi", "NIfTI"), ("monuseg", "XML"), ("cpm17", "MAT"), ("fastmri-brain", "HDF5")]:

    def _run(s: Scratch, dataset=_dataset) -> Observed:
        from fedistill.data.registry import DATASETS

        (s.folder / "data" / DATASETS[dataset].subdir).mkdir(parents=True)
        return s.cli(*DATA, "--dataset", dataset, "--data-dir", "data")

    _promise = Promise(2, words="expected")
    CASES.append(
        Case(f"{_dataset}-empty-folder", "data", f"{_kind} loader on an empty folder", _promise, _run)
    )


# --- run directory (a copy of the reference fedavg run, made to look killed after round 4) ---------------
FALLBACK = Promise(0, lines=0, words="resuming from round_00003", resume_equal=True)
for _name, _does, _damage in [
    (
        "ckpt-truncated",
        "newest checkpoint's server.safetensors cut to 1000 bytes",
        lambda c: (c / "server.safetensors").write_bytes((c / "server.safetensors").read_bytes()[:1000]),
    ),
    (
        "ckpt-flipped-byte",
        "one byte of the newest server.safetensors flipped",
        lambda c: flip_last_byte(c / "server.safetensors"),
    ),
    ("ckpt-missing-file", "newest checkpoint's runner.json deleted", lambda c: (c / "runner.json").unlink()),
    (
        "ckpt-torn-json",
        "newest checkpoint's server.json cut",
        lambda c: (c / "server.json").write_text('{"m": {'),
    ),
]:

    def _run(s: Scratch, damage=_damage) -> Observed:
        run = killed_copy(s)
        damage(checkpoint(run, 4))
        return resumed(s, run)

    CASES.append(Case(_name, "run directory", _does, FALLBACK, _run))


@case("ckpt-none-intact", "run directory", "both checkpoints damaged", Promise(2, words="another --name"))
def _none_intact(s: Scratch) -> Observed:
    run = killed_copy(s)
    for round_ in (3, 4):
        (checkpoint(run, round_) / "server.json").write_text("{")
    return s.cli("run", "--resume", "runs/r", "--quiet")


@case(
    "ckpt-folders-gone",
    "run directory",
    "checkpoint folders deleted, `latest` kept",
    Promise(2, words="checkpoint folders are gone"),
)
def _folders_gone(s: Scratch) -> Observed:
    run = killed_copy(s)
    for round_ in (3, 4):
        shutil.rmtree(checkpoint(run, round_))
    return s.cli("run", "--resume", "runs/r", "--quiet")


@case(
    "stale-temp-checkpoint",
    "run directory",
    "a `.round_*` folder a killed write left",
    Promise(0, lines=0, resume_equal=True),
)
def _stale_temp(s: Scratch) -> Observed:
    run = killed_copy(s)
    shutil.rmtree(checkpoint(run, 4))
    (run / "fedavg" / "checkpoints" / "latest").write_text("round_00003")
    stale = run / "fedavg" / "checkpoints" / ".round_00004-killed"
    stale.mkdir()
    (stale / "runner.json").write_text("{")
    return resumed(s, run)


@case(
    "metrics-torn-last-line",
    "run directory",
    "a half-written row after the last metrics line",
    Promise(0, lines=0, resume_equal=True),
)
def _torn_line(s: Scratch) -> Observed:
    run = killed_copy(s)
    with (run / "fedavg" / "metrics.jsonl").open("a") as f:
        f.write('{"round": 5, "test_acc')
    return resumed(s, run)


@case(
    "metrics-shorter-than-checkpoint",
    "run directory",
    "metrics.jsonl's 4th row torn",
    Promise(0, lines=0, words="metrics.jsonl holds 3 records", resume_equal=True),
)
def _short_metrics(s: Scratch) -> Observed:
    run = killed_copy(s)
    lines = (run / "fedavg" / "metrics.jsonl").read_text().splitlines()
    (run / "fedavg" / "metrics.jsonl").write_text("\n".join(lines[:3]) + "\n" + lines[3][:10])
    return resumed(s, run)


@case(
    "summary-damaged",
    "run directory",
    "`fedistill summary` of a torn summary.json, then --resume",
    Promise(2, words="summary.json is damaged", resume_equal=True),
)
def _summary_damaged(s: Scratch) -> Observed:
    run = s.copy_of_reference("fedavg")
    (run / "fedavg" / "summary.json").write_text('{"algorithm": "fe')
    seen = s.cli("summary", "runs/r")
    rebuilt = resumed(s, run)
    seen.resume_equal, seen.checks["--resume exits 0"] = rebuilt.resume_equal, rebuilt.exit_code == 0
    return seen


@case("resume-algorithm-folder", "run directory", "--resume RUN/fedavg", Promise(2, words="--resume runs/r"))
def _algorithm_folder(s: Scratch) -> Observed:
    s.copy_of_reference("fedavg")
    return s.cli("run", "--resume", "runs/r/fedavg", "--quiet")


@case("resume-changed-config", "run directory", "--resume RUN --rounds 9", Promise(2, words="saved config"))
def _changed(s: Scratch) -> Observed:
    s.copy_of_reference("fedavg")
    return s.cli("run", "--resume", "runs/r", "--rounds", "9", "--quiet")


@case("name-taken", "run directory", "a new run under a finished run's name", Promise(2, words="--resume"))
def _name_taken(s: Scratch) -> Observed:
    s.copy_of_reference("fedavg")
    return s.cli("run", *SETTINGS["fedavg"], "--out", "runs", "--name", "r")


@case(
    "lock-held",
    "run directory",
    "--resume of a run another live process is writing",
    Promise(2, words="another fedistill process"),
)
def _lock_held(s: Scratch) -> Observed:
    run, process = started(s, "fedavg", rounds="400")
    try:
        ready = wait_for(checkpoint_reached(run, "fedavg", 1), process)
        seen = s.cli("run", "--resume", "runs/k", "--quiet")
        seen.checks["the writer was running"] = ready and process.poll() is None
        seen.checks["names the writer's pid"] = f"pid {process.pid}" in seen.stderr
    finally:
        process.kill()
        process.communicate()
    return seen


@case(
    "read-only-rundir",
    "run directory",
    "--resume of a run folder that cannot be written",
    Promise(2, words="cannot be written"),
)
def _read_only(s: Scratch) -> Observed:
    run = killed_copy(s)
    if os.geteuid() != 0:  # an owner's chmod stops its own writes
        folders = [run, *(p for p in run.rglob("*") if p.is_dir())]
        for folder in folders:
            folder.chmod(0o555)
        try:
            return s.cli("run", "--resume", "runs/r", "--quiet")
        finally:
            for folder in folders:
                folder.chmod(0o755)
    # root writes through permissions; a read-only bind mount in a private namespace stops it too
    script = (
        f"mount --bind runs/r runs/r && mount -o remount,bind,ro runs/r || exit 97\n"
        f"exec {shlex.join(command())} run --resume runs/r --quiet"
    )
    seen = shell(s, script, private=True)
    if seen.exit_code == 97 or seen.stderr.startswith("unshare:"):
        return Observed(not_run="root here, and no private mount namespace to make the folder read-only")
    return seen


def kill_and_resume(s: Scratch, algorithm: str) -> Observed:
    run, process = started(s, algorithm)
    reached = wait_for(checkpoint_reached(run, algorithm, 2), process)
    process.kill()
    process.communicate()
    seen = resumed(s, run, algorithm)
    seen.checks["killed after round 2, before the end"] = reached and process.returncode == -signal.SIGKILL
    return seen


for _algorithm in ("fedavg", "feddf", "fediod", "standalone"):
    CASES.append(
        Case(
            f"kill9-{_algorithm}",
            "interruption",
            f"kill -9 a {_algorithm} run after round 2, --resume",
            Promise(0, lines=0, resume_equal=True),
            lambda s, a=_algorithm: kill_and_resume(s, a),
        )
    )


@case(
    "ctrl-c",
    "interruption",
    "SIGINT to a fedavg run after round 1, then --resume",
    Promise(130, words="continue with --resume runs/k", resume_equal=True),
)
def _ctrl_c(s: Scratch) -> Observed:
    run, process = started(s, "fedavg")
    reached = wait_for(checkpoint_reached(run, "fedavg", 1), process)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=TIMEOUT)
    seen = Observed(process.returncode, err)
    after = resumed(s, run)
    seen.resume_equal, seen.checks["interrupted mid-run"] = after.resume_equal, reached
    seen.checks["--resume exits 0"] = after.exit_code == 0
    return seen


@case("diverging-loss", "stop", "--lr 1e12: the loss diverges", Promise(1, words="run stopped"))
def _diverging(s: Scratch) -> Observed:
    return s.cli("run", *SETTINGS["fedavg"], "--lr", "1e12", "--out", "runs", "--name", "d")


# --- caches and disks ---------------------------------------------------------------------------------------
@case(
    "stage1-cache-flipped-byte",
    "cache",
    "a byte flipped in a cached FedIOD teacher, then a new run",
    Promise(0, lines=0, words="does not match its checksum", resume_equal=True),
)
def _cache(s: Scratch) -> Observed:
    reference = s.reference("fediod")
    shutil.copytree(reference.parent / ".cache", s.folder / "runs" / ".cache")
    entries = sorted((s.folder / "runs" / ".cache").rglob("teacher-*.safetensors"))
    flip_last_byte(entries[-1])
    seen = s.cli("run", *SETTINGS["fediod"], "--out", "runs", "--name", "again")
    seen.resume_equal = s.equals_reference(s.folder / "runs" / "again", "fediod")
    seen.checks["the cache held teachers"] = bool(entries)
    return seen


@case(
    "full-disk",
    "disk",
    "a 420 KiB tmpfs (else `ulimit -f 150`) fills up at a checkpoint; then room, --resume",
    Promise(1, words="--resume disk/r", resume_equal=True),
)
def _full_disk(s: Scratch) -> Observed:
    cli = shlex.join(command())
    run = shlex.join(["run", *SETTINGS["fedavg"], "--out", "disk", "--name", "r"])
    steps = (
        "{first} 2> err.txt; echo $? > rc.txt\nfind disk -name '.round_*' > left.txt\n"
        'c=disk/r/fedavg/checkpoints; test -d "$c/$(cat $c/latest)" && echo kept > latest.txt\n'
        f"{{free}}\n{cli} run --resume disk/r --quiet 2> err2.txt; echo $? > rc2.txt\ncp -a disk/r copy\n"
    )
    tmpfs = "mkdir disk && mount -t tmpfs -o size=420k tmpfs disk || exit 97\n"
    free = "mount -o remount,size=64m disk"
    shell(s, tmpfs + steps.format(first=f"{cli} {run}", free=free), private=True)
    if not (s.folder / "rc.txt").is_file():  # no private namespace (no unshare, or not allowed here)
        # no mount here: a file-size limit fails the first checkpoint's write (EFBIG; Python ignores SIGXFSZ)
        shutil.rmtree(s.folder / "disk", ignore_errors=True)
        first = f"(ulimit -f 150; exec {cli} {run})"
        if shell(s, "mkdir disk\n" + steps.format(first=first, free=":"), private=False).exit_code:
            return Observed(not_run="neither a private tmpfs nor a file-size limit could be set here")
    read = lambda name: (s.folder / name).read_text()  # noqa: E731
    seen = Observed(int(read("rc.txt")), read("err.txt"))
    seen.resume_equal = s.equals_reference(s.folder / "copy", "fedavg")
    seen.checks["names the file it could not write"] = (
        "cannot write disk/r/fedavg/checkpoints/" in seen.stderr
    )
    seen.checks["no .round_* temporary left"] = read("left.txt").strip() == ""
    seen.checks["--resume exits 0"] = read("rc2.txt").strip() == "0"
    if "No space left" in seen.stderr:  # a full tmpfs keeps the checkpoints before the one that failed
        seen.checks["`latest` names a kept checkpoint"] = (s.folder / "latest.txt").is_file()
    return seen


# --- predict and export -------------------------------------------------------------------------------------
def predict(name: str, does: str, words: str, make: Callable[[Path], None] | None, *extra: str) -> None:
    def run(s: Scratch) -> Observed:
        if make is not None:
            make(s.folder)
        return s.cli("predict", str(s.reference("fedavg")), "--output", "out.csv", *extra)

    CASES.append(Case(name, "predict/export", does, Promise(2, words=words), run))


predict("predict-missing-input", "--input missing.png", "does not exist", None, "--input", "missing.png")
predict(
    "predict-unreadable-image",
    "--input broken.png (not a PNG)",
    "cannot read image",
    lambda f: (f / "broken.png").write_bytes(b"not a png"),
    "--input",
    "broken.png",
)
predict("predict-wrong-channels", "--input a 5-channel TIFF", "5 channels", tif5, "--input", "five.tif")
predict(
    "predict-wrong-task", "--input a NIfTI volume for a classifier", "NIfTI", nifti, "--input", "v.nii.gz"
)
predict(
    "predict-output-exists",
    "--output a file that exists",
    "already exists",
    lambda f: (png(f), (f / "out.csv").write_text("old")),
    "--input",
    "a.png",
)


@case(
    "export-unknown-algorithm",
    "predict/export",
    "export --algorithm fediod of a fedavg run",
    Promise(2, words="fediod"),
)
def _export_algorithm(s: Scratch) -> Observed:
    s.copy_of_reference("fedavg")
    return s.cli("export", "runs/r", "--algorithm", "fediod")
