"""Start, watch and stop real Flower processes (SuperLink, SuperNodes, `flwr run`) for tests and benchmarks.

Every process started here gets a private `FLWR_HOME`, `HOME`, free ports, and a marker variable in its
environment. Flower detaches some of its processes (the local SuperLink that `flwr run . local` spawns,
the SuperExec of every SuperLink and SuperNode), so they are not found through our `Popen` handles: they
are found by the marker in `/proc/<pid>/environ`, which every descendant inherits, and ended by PID.

    with deployment(tmp_path, n_nodes=2, tls=False) as dep:
        dep.flwr_run({"rounds": 2, "out": str(tmp_path / "runs"), "name": "r"}, timeout=300)

Every wait has a deadline; a failure names what it waited for and shows the tail of every log.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import tomllib
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomli_w

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
MARKER = "FEDISTILL_FLOWER_HARNESS"


class HarnessError(AssertionError):
    """A Flower process did not do what the harness waited for (the message carries the logs)."""


# --- ports, environment ----------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def flower_env(home: Path, token: str) -> dict[str, str]:
    """The environment of every Flower process: private FLWR_HOME/HOME, no telemetry, no `uv sync`."""
    env = dict(os.environ)
    env.update(
        {
            "PATH": f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}",
            "FLWR_HOME": str(home / "flwr"),
            "HOME": str(home),
            "FLWR_TELEMETRY_ENABLED": "0",
            "FLWR_DISABLE_UPDATE_CHECK": "1",
            "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
            "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0",
            # `flwr run . local` spawns its SuperLink on fixed ports unless told otherwise
            "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(free_port()),
            "FLWR_LOCAL_CONTROL_API_PORT": str(free_port()),
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",  # torch reads it after OMP_NUM_THREADS (conftest.py)
            "MPLBACKEND": "Agg",
            "PYTHONUNBUFFERED": "1",
            MARKER: token,
        }
    )
    (home / "flwr").mkdir(parents=True, exist_ok=True)
    return env


# --- processes -------------------------------------------------------------------------------------
@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    log: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def tail(self, lines: int = 40) -> str:
        try:
            text = self.log.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError as exc:
            return f"(no log: {exc})"
        return "\n".join(text[-lines:])


def _state(pid: int) -> str | None:
    """The process state letter (R, S, Z, ...), or None when the process is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def marked_processes(token: str) -> dict[int, str]:
    """pid -> command line of every live (non-zombie) process whose environment carries the marker."""
    needle = f"{MARKER}={token}".encode()
    found: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            environ = (entry / "environ").read_bytes()
            if needle not in environ.split(b"\0"):
                continue
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if _state(pid) not in (None, "Z"):
            found[pid] = cmdline.strip()
    return found


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


class Processes:
    """The processes one test started, their logs, and their orderly end."""

    def __init__(self, root: Path, *, token: str | None = None) -> None:
        self.root = root
        self.token = token or uuid.uuid4().hex
        self.env = flower_env(root, self.token)
        self.logs = root / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.procs: list[Proc] = []

    @property
    def flwr_home(self) -> Path:
        return Path(self.env["FLWR_HOME"])

    def start(self, name: str, argv: list[str], *, cwd: Path = REPO) -> Proc:
        log = self.logs / f"{name}.log"
        with log.open("ab") as out:
            out.write(f"$ {shlex.join(argv)}\n".encode())
            out.flush()
            popen = subprocess.Popen(
                argv,
                cwd=cwd,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: a signal to us does not reach it
            )
        proc = Proc(name, popen, log)
        self.procs.append(proc)
        return proc

    def call(self, name: str, argv: list[str], *, timeout: float, cwd: Path = REPO) -> str:
        """Run a short command to completion; its output, or a HarnessError."""
        proc = self.start(name, argv, cwd=cwd)
        try:
            rc = proc.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.fail(f"`{shlex.join(argv)}` did not finish within {timeout:.0f} s")
        if rc != 0:
            self.fail(f"`{shlex.join(argv)}` exited with code {rc}")
        return proc.log.read_text(encoding="utf-8", errors="replace")

    def diagnostics(self, lines: int = 40) -> str:
        parts = []
        for proc in self.procs:
            rc = proc.popen.poll()
            parts.append(
                f"----- {proc.name} (pid {proc.pid}, exit {rc}) {proc.log} -----\n{proc.tail(lines)}"
            )
        for extra in sorted(self.flwr_home.rglob("*.log")):
            text = extra.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:]
            parts.append(f"----- {extra} -----\n" + "\n".join(text))
        return "\n".join(parts)

    def fail(self, message: str) -> None:
        raise HarnessError(f"{message}\n{self.diagnostics()}")

    def wait_for(
        self,
        condition: Callable[[], bool],
        what: str,
        *,
        timeout: float,
        poll: float = 0.5,
        alive: list[Proc] | None = None,
    ) -> float:
        """Poll until `condition()`; fail after `timeout` s or as soon as a process in `alive` exits."""
        started = time.monotonic()
        while True:
            if condition():
                return time.monotonic() - started
            for proc in alive or []:
                if proc.popen.poll() is not None:
                    self.fail(f"waiting for {what}: {proc.name} exited with code {proc.popen.returncode}")
            if time.monotonic() - started > timeout:
                self.fail(f"waiting for {what}: nothing after {timeout:.0f} s")
            time.sleep(poll)

    def stop(self, grace: float = 10.0) -> dict[int, str]:
        """End every process this harness started (found by the marker) by PID: TERM, wait, KILL.

        Returns what is still alive afterwards (should be nothing)."""
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
            targets = marked_processes(self.token)
            targets.update({p.pid: p.name for p in self.procs if p.popen.poll() is None})
            if not targets:
                break
            for pid in targets:
                _signal(pid, sig)
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                for proc in self.procs:
                    proc.popen.poll()  # reap our direct children
                if not marked_processes(self.token):
                    break
                time.sleep(0.2)
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.popen.wait(timeout=1.0)
        return marked_processes(self.token)


# --- `flwr` CLI ------------------------------------------------------------------------------------
def flwr_bin(name: str) -> str:
    path = VENV_BIN / name
    return str(path) if path.exists() else name


def toml_value(value: Any) -> str:
    """One `-c` value as TOML (strings quoted)."""
    return tomli_w.dumps({"v": value}).split("=", 1)[1].strip()


def run_config_arg(overrides: dict[str, Any]) -> str:
    return " ".join(f"{key}={toml_value(value)}" for key, value in overrides.items())


def init_flower_config(procs: Processes) -> Path:
    """Let `flwr` create its default config.toml (it does on first use), then return its path."""
    procs.call("flwr-config-init", [flwr_bin("flwr"), "config", "list"], timeout=60)
    path = procs.flwr_home / "config.toml"
    if not path.is_file():
        procs.fail(f"`flwr config list` did not create {path}")
    return path


def add_connection(procs: Processes, name: str, entry: dict[str, Any]) -> None:
    """Add `[superlink.<name>]` to $FLWR_HOME/config.toml, keeping what flwr wrote there."""
    path = procs.flwr_home / "config.toml"
    if not path.is_file():
        init_flower_config(procs)
    config = tomllib.loads(path.read_text(encoding="utf-8"))
    config.setdefault("superlink", {})[name] = entry
    path.write_text(tomli_w.dumps(config), encoding="utf-8")


def flwr_run(
    procs: Processes,
    federation: str,
    overrides: dict[str, Any],
    *,
    timeout: float,
    summary: Path | None = None,
    federation_config: str | None = None,
    tag: str = "flwr-run",
) -> float:
    """`flwr run . <federation> --stream -c ...` from the repository; waits for it (and `summary`).

    Returns the wall time in seconds."""
    argv = [flwr_bin("flwr"), "run", ".", federation, "--stream"]
    if federation_config:
        argv += ["--federation-config", federation_config]
    argv += ["-c", run_config_arg(overrides)]
    started = time.monotonic()
    proc = procs.start(tag, argv)
    try:
        rc = proc.popen.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        procs.fail(f"`flwr run` did not finish within {timeout:.0f} s")
    if rc != 0:
        procs.fail(f"`flwr run` exited with code {rc}")
    if summary is not None:
        # --stream returns when the run ends; give the ServerApp's last write a few seconds
        procs.wait_for(summary.is_file, f"{summary}", timeout=30)
    return time.monotonic() - started


# --- TLS -------------------------------------------------------------------------------------------
def make_certificates(folder: Path, host: str = "127.0.0.1") -> dict[str, Path]:
    """A CA and a server certificate for `host` (SAN: IP 127.0.0.1, DNS localhost), PEM files."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    valid = (now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=2))

    ca_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fedistill test CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(valid[0])
        .not_valid_after(valid[1])
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
                encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(valid[0])
        .not_valid_after(valid[1])
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )

    paths = {"ca": folder / "ca.crt", "cert": folder / "server.pem", "key": folder / "server.key"}
    paths["ca"].write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    paths["cert"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths["key"].write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    paths["key"].chmod(0o600)
    return paths


# --- a deployment on loopback ----------------------------------------------------------------------
@dataclass
class Deployment:
    federation: str
    address: str
    procs: Processes
    superlink: Proc
    supernodes: list[Proc]
    certificates: dict[str, Path] | None = None
    state_dirs: list[Path] = field(default_factory=list)

    def flwr_run(self, overrides: dict[str, Any], *, timeout: float, summary: Path | None = None) -> float:
        return flwr_run(self.procs, self.federation, overrides, timeout=timeout, summary=summary)

    def online_nodes(self) -> int:
        """How many SuperNodes the SuperLink lists as online (`flwr supernode list --format json`)."""
        argv = [flwr_bin("flwr"), "supernode", "list", self.federation, "--format", "json"]
        out = subprocess.run(argv, env=self.procs.env, cwd=REPO, capture_output=True, text=True, timeout=60)
        try:
            text = out.stdout
            data = json.loads(text[text.index("{") :])
        except ValueError:
            return 0
        nodes = data.get("nodes", [])
        return sum(1 for node in nodes if str(node.get("status", "")).lower() == "online")


def _superlink_argv(port: int, certificates: dict[str, Path] | None) -> list[str]:
    argv = [flwr_bin("flower-superlink")]
    if certificates is None:
        argv.append("--insecure")
    else:
        argv += [
            "--ssl-ca-certfile", str(certificates["ca"]),
            "--ssl-certfile", str(certificates["cert"]),
            "--ssl-keyfile", str(certificates["key"]),
        ]  # fmt: skip
    return [*argv, "--host", "127.0.0.1", "--port", str(port), "--disable-runtime-dependency-installation"]


def _supernode_argv(
    address: str, port: int, node_config: str, certificates: dict[str, Path] | None
) -> list[str]:
    argv = [flwr_bin("flower-supernode")]
    argv += ["--insecure"] if certificates is None else ["--root-certificates", str(certificates["ca"])]
    return [*argv, "--superlink", address, "--port", str(port), "--node-config", node_config]


@contextlib.contextmanager
def deployment(
    tmp_path: Path,
    n_nodes: int,
    tls: bool,
    *,
    federation: str = "deploy",
    node_config: Callable[[int], dict[str, Any]] | None = None,
    startup_timeout: float = 120.0,
) -> Iterator[Deployment]:
    """A SuperLink and `n_nodes` SuperNodes on loopback, and `[superlink.<federation>]` in config.toml.

    Node i gets `partition-id=i num-partitions=n_nodes state-dir=<tmp>/node-i` (plus `node_config(i)`).
    On exit every process started is ended by PID; a survivor raises HarnessError."""
    procs = Processes(tmp_path / "deployment")
    ended_cleanly = False
    try:
        certificates = make_certificates(tmp_path / "deployment" / "certs") if tls else None
        port = free_port()
        address = f"127.0.0.1:{port}"
        superlink = procs.start("superlink", _superlink_argv(port, certificates))
        procs.wait_for(
            lambda: port_open(port), f"the SuperLink to listen on {address}",
            timeout=startup_timeout, alive=[superlink],
        )  # fmt: skip
        init_flower_config(procs)
        entry: dict[str, Any] = {"address": address}
        if certificates is None:
            entry["insecure"] = True
        else:
            entry["root-certificates"] = str(certificates["ca"])
        add_connection(procs, federation, entry)

        supernodes, state_dirs = [], []
        for i in range(n_nodes):
            state_dir = tmp_path / "deployment" / f"node-{i}"
            state_dir.mkdir(parents=True, exist_ok=True)
            config = {"partition-id": i, "num-partitions": n_nodes, "state-dir": str(state_dir)}
            config.update(node_config(i) if node_config else {})
            supernodes.append(
                procs.start(
                    f"supernode-{i}",
                    _supernode_argv(address, free_port(), run_config_arg(config), certificates),
                )
            )
            state_dirs.append(state_dir)
        dep = Deployment(federation, address, procs, superlink, supernodes, certificates, state_dirs)
        procs.wait_for(
            lambda: dep.online_nodes() >= n_nodes, f"{n_nodes} SuperNodes online at {address}",
            timeout=startup_timeout, poll=1.0, alive=[superlink, *supernodes],
        )  # fmt: skip
        yield dep
        ended_cleanly = True
    finally:
        _stop(procs, "the deployment ended", raise_on_survivors=ended_cleanly)


@contextlib.contextmanager
def local_superlink(tmp_path: Path) -> Iterator[Processes]:
    """For `flwr run . local`: a private FLWR_HOME (and ports); on exit, the detached local SuperLink
    and everything under it are ended by PID."""
    procs = Processes(tmp_path / "local")
    ended_cleanly = False
    try:
        yield procs
        ended_cleanly = True
    finally:
        _stop(procs, "the local SuperLink was stopped", raise_on_survivors=ended_cleanly)


def _stop(procs: Processes, when: str, *, raise_on_survivors: bool) -> None:
    """End every process; survivors fail the test, unless it is failing already (then they are printed,
    so that the first error stays the one reported)."""
    left = procs.stop()
    if not left:
        return
    message = f"processes still alive after {when}: {left}"
    if raise_on_survivors:
        raise HarnessError(message)
    print(message, file=sys.stderr)


# --- comparing runs ------------------------------------------------------------------------------
HELLO = "query.hello"


def ledger_totals(ledger: Path, *, skip_types: tuple[str, ...] = (HELLO,)) -> dict[str, int]:
    """Bytes per `direction/client/kind`, and message counts per `direction/client/#messages`,
    recomputed from ledger.jsonl without the transport's handshake."""
    totals: dict[str, int] = {}
    for line in ledger.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        if record["type"] in skip_types:
            continue
        prefix = f"{record['direction']}/{record['client']}"
        totals[f"{prefix}/#messages"] = totals.get(f"{prefix}/#messages", 0) + 1
        for kind, size in record["kinds"].items():
            totals[f"{prefix}/{kind}"] = totals.get(f"{prefix}/{kind}", 0) + size
    return totals


def round_times(metrics: Path) -> list[float]:
    rows = [json.loads(line) for line in metrics.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [float(row["round_time_s"]) for row in rows if "round_time_s" in row]
