"""Run configuration: one flat set of common keys plus one table of options per algorithm.

Sources, later ones winning: the defaults below, a TOML file (`--config`), CLI flags, `--set k=v`.
The resolved configuration is written to the run directory as `config.toml`.
"""

from __future__ import annotations

import dataclasses
import datetime
import difflib
import math
import tomllib
import types
import typing
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import tomli_w

from fedistill.errors import ConfigError, unknown_name


@dataclass(frozen=True)
class RunConfig:
    """Every key of a run. Algorithm-specific options live in `options[algorithm_name]`."""

    algorithm: str = "fedavg,standalone,centralized"  # comma-separated: several runs side by side
    dataset: str = "digits"
    data_dir: str = "data"
    # "": every site cuts its shard from the whole dataset; a folder ({site}: the site's number) where each
    # site reads only its own records, the server then using data_dir for its test and validation data
    site_data_dir: str = ""
    download: bool = False
    model: str = "resnet8"
    norm: str = "auto"  # auto (the model's own: batch; instance for unet-fastmri) | batch | group | none
    group_norm_groups: int = 2
    # true: after the last round, the exported model's BatchNorm statistics recomputed on the sites' data
    recalibrate_norm: bool = False
    private_init: str = "shared"  # shared | client: where the part a method keeps private starts
    clients: int = 10
    partition: str = "dirichlet"
    alpha: float = 0.5
    val_fraction: float = 0.1  # held out from the training data, FedDF-style
    # auto: subjects for a per-pixel set's natural sites, else random | random | tail | subjects
    val_mode: str = "auto"
    fraction: float = 1.0  # clients sampled per round
    rounds: int = 10
    local_epochs: int = 1
    local_steps: int = 0  # > 0: this many mini-batch steps per round instead of epochs
    batch_size: int = 32
    optimizer: str = "sgd"  # sgd | adam
    lr: float = 0.05
    momentum: float = 0.0
    weight_decay: float = 0.0
    augment: str = "auto"  # auto (the dataset's usual augmentation) | on | off
    # the one seed of the run (partition, initialisation, sampling, client order): a whole number in
    # 0..2**63 - 1, the largest a TOML file such as config.toml holds
    seed: int = 0
    out: str = "runs"
    # run directory name; empty: <dataset>-<time> (the local date and time it started; -2, -3, ... added
    # when a run started in the same second holds it)
    name: str = ""
    eval_every: int = 1
    checkpoint_every: int = 1
    timeout: float = 0.0  # seconds a client may take to answer; 0: no limit in-process, 600 s on Flower
    min_clients: int = 1  # fewer replies than this stop the run
    # seconds a Flower server waits for every site's node to connect (a deployment's sites may start later)
    connect_timeout: float = 300.0
    max_message_mb: float = 512.0  # size cap on one message in MiB (2^20 bytes; printed sizes are MB of 10^6)
    # torch intra-op threads, 0 (torch's default) to 1024: a fixed bound rather than this machine's cores, so
    # a run made on a large machine resumes on a small one (more threads than cores only runs slower)
    threads: int = 0
    device: str = "auto"  # auto (CUDA, else MPS, else CPU) | cpu | cuda | cuda:N | mps (fedistill/devices.py)
    stage1_cache: bool = True  # reuse a site's stage-1 model when a run needs exactly it (stage1.py)
    cache_dir: str = ""  # where sites keep stage-1 models; "": `.cache` beside the run directory (in --out)
    transport: str = "inprocess"  # inprocess | flower (Flower's simulation engine)
    track: str = ""  # "" | tensorboard | mlflow | tensorboard,mlflow: where to stream (engine/tracking.py)
    options: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def algorithms(self) -> list[str]:
        """The algorithms of the comma-separated `algorithm` key, in order, blanks left out."""
        return [a.strip() for a in self.algorithm.split(",") if a.strip()]

    def replace(self, **changes: Any) -> RunConfig:
        """A copy of the config with `changes` applied."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """The config as config.toml writes it: the common keys, then each options table; `track`,
        `site_data_dir` and `recalibrate_norm` only when set (runs without them save as they did before)."""
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "options"}
        for key in ("track", "site_data_dir", "recalibrate_norm"):
            if not data[key]:
                del data[key]
        data.update({name: dict(values) for name, values in sorted(self.options.items())})
        return data


_COMMON = {f.name: f for f in fields(RunConfig) if f.name != "options"}

#: The most `threads` a run may name: more than any CPU has cores, and fixed (not this machine's cores) so a
#: config accepted on one machine resumes on any other. 100000 OS threads exhausted a process's memory.
MAX_THREADS = 1024
#: The largest seed: TOML integers are signed 64-bit, and a run's config.toml holds its seed.
MAX_SEED = 2**63 - 1

#: Keys whose options have a table of their own: a TOML file cannot hold `partition = "iid"` and a
#: `[partition]` table, and config.toml must hold both.
TABLE_HINTS = {
    "model": "; model options go in [model_options]",
    "partition": "; partitioner options go in [partition_options]",
}

#: Tables of every run, whatever it runs: the model's, the partitioner's and the task's options.
RUN_TABLES = ("model_options", "partition_options", "task")

#: Keys whose text names several things, separated by commas (a TOML list is the natural guess).
LIST_KEYS = ("algorithm", "track")

#: The experiment trackers `track` may name (engine/tracking.py).
TRACKERS = ("tensorboard", "mlflow")


def tracker_names(track: str) -> list[str]:
    """The trackers a `track` value names, in order, each once."""
    return list(dict.fromkeys(name.strip() for name in track.split(",") if name.strip()))


def _check_value(key: str, value: Any, annotation: Any) -> Any:
    """Coerce ints to floats where a float is declared; reject anything of the wrong type."""
    hint = annotation if not isinstance(annotation, str) else eval(annotation, vars(typing))
    if isinstance(hint, types.UnionType):
        for option in typing.get_args(hint):
            try:
                return _check_value(key, value, option)
            except ConfigError:
                continue
        raise ConfigError(f"{key} = {value!r} is not a {hint}")
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint is float and isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{key} must be a finite number, got {value!r}")
    origin = typing.get_origin(hint) or hint
    if origin is typing.Any:
        return value
    if hint is int and isinstance(value, bool):
        raise ConfigError(f"{key} must be an integer, got {value!r}")
    if hint is bool and not isinstance(value, bool):  # `--set download=False` arrives as the text 'False'
        raise ConfigError(f"{key} must be true or false (lower case, as TOML writes them), got {value!r}")
    if not isinstance(value, origin):
        raise ConfigError(f"{key} must be {getattr(hint, '__name__', hint)}, got {value!r}")
    return value


#: Which keys each config table takes (an algorithm's options, a dataset's, [model_options], [task]) in a
#: run of the dataset named (its table under that spelling), asked only when a key is unknown: config.py
#: imports no registry, so the layers above hand this in (engine/key_homes.py), and an unknown key's
#: error says where the key belongs.
Homes = Callable[[str], Mapping[str, Collection[str]]]


def toml_literal(value: Any) -> str:
    """`value` on one line, as TOML (and so `--set`) reads it; a value TOML cannot hold (None, an object a
    user's own options class keeps) as Python writes it, rather than failing the message that shows it."""
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_literal(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {toml_literal(v)}" for k, v in value.items()) + "}"
    try:
        return tomli_w.dumps({"v": value}).partition("=")[2].strip()
    except TypeError:
        return repr(value)


def _where(key: str, value: Any, homes: Homes | None, run: tuple[str, str], table: str = "") -> str:
    """'' when no table but `table` takes `key`, else which tables do (the run's own algorithms, then its
    dataset, first) and how to set it in the first: a key written in the wrong place is no misspelling."""
    algorithm, dataset = run
    tables = [
        name for name, keys in (homes(dataset) if homes else {}).items() if key in keys and name != table
    ]
    if not tables:
        return ""
    running = [a.strip() for a in algorithm.split(",") if a.strip()] + [dataset, *RUN_TABLES]
    tables.sort(key=lambda name: running.index(name) if name in running else len(running))
    first, others = tables[0], tables[1:]
    more = f" and {len(others) - 3} more" if len(others) > 3 else ""
    also = f" (and of {', '.join(others[:3])}{more})" if others else ""
    if first not in running:
        which = "none of which this run uses" if others else "which this run does not use"
        also += f", {which} (algorithm = {algorithm!r}, dataset = {dataset!r})"
    write = f"{first}.{key}={toml_literal(value)}"
    return f"it is an option of {first}{also}: write {write} or put it under [{first}]"


def _unknown(key: str, valid: list[str], where: str = "") -> ConfigError:
    """Unknown key: where it belongs when another table takes it (`where`), else a did-you-mean only from
    keys close to it (for `table.key`, close in `key`)."""
    if where:
        return ConfigError(f"unknown config key {key!r}: {where}")
    section, dot, name = key.rpartition(".")
    if not dot:
        return unknown_name("config key", key, sorted(valid), ConfigError)  # type: ignore[return-value]
    names = sorted(v.rpartition(".")[2] for v in valid)
    close = difflib.get_close_matches(name, names, n=1)
    hint = f"; did you mean '{section}.{close[0]}'?" if close else ""
    return ConfigError(f"unknown config key {key!r}{hint} (valid: {', '.join(sorted(valid))})")


def parse_value(text: str) -> Any:
    """A `--set` value: a TOML literal if it parses (1, 0.5, true, [1,2]), else a plain string. A date or
    time literal stays text: no key takes one, so `name=2024-06-01` names a run."""
    try:
        value = tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text
    return text if isinstance(value, datetime.date | datetime.time) else value


def parse_assignment(text: str) -> tuple[str, Any]:
    """The key and parsed value of a `--set key=value` argument."""
    if not text.partition("=")[0].strip() or "=" not in text:
        raise ConfigError(f"--set expects key=value, got {text!r}")
    key, _, value = text.partition("=")
    key, parsed = key.strip(), parse_value(value.strip())
    if key in _COMMON and _COMMON[key].type == "str" and not isinstance(parsed, str | dict | list):
        return key, value.strip()  # `name=2024` names a run, as `--name 2024` does: the key takes text
    return key, parsed


def load_toml(path: str | Path) -> dict[str, Any]:
    """The tables of a TOML config file; ConfigError naming the file when it is missing, a folder or not
    TOML."""
    path = Path(path).expanduser()
    if path.is_dir():
        raise ConfigError(f"--config {path} is a folder; pass a TOML file (e.g. {path}/experiment.toml)")
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None


def build_config(
    base: RunConfig | None = None, *layers: dict[str, Any], homes: Homes | None = None
) -> RunConfig:
    """Merge layers of keys (nested tables or dotted keys) onto `base`, checking every key and type; an
    unknown key that a table of `homes` takes is said to belong there."""
    base = base or RunConfig()
    common: dict[str, Any] = {}
    options: dict[str, dict[str, Any]] = {k: dict(v) for k, v in base.options.items()}
    for layer in layers:
        for key, value in layer.items():
            if isinstance(value, dict) or "." in key:
                section, _, sub = key.partition(".")
                if section in _COMMON:
                    hint = TABLE_HINTS.get(section, "")
                    raise ConfigError(f"{section} is a key, not a table: {key} cannot be set{hint}")
            if isinstance(value, dict):
                options.setdefault(key, {}).update(value)
            elif "." in key:
                options.setdefault(section, {})[sub] = value
            elif key in LIST_KEYS and isinstance(value, list) and all(isinstance(v, str) for v in value):
                joined = ",".join(value)
                if not value:  # `[]`: the default, since an empty name is refused for algorithm
                    joined = _COMMON[key].default
                said = f"{key} = {joined!r}" + ("" if value else " (its default)")
                raise ConfigError(
                    f"{key} is one text value, its names separated by commas, not a list: {said}"
                )
            elif key in _COMMON:
                common[key] = _check_value(key, value, _COMMON[key].type)
            else:
                raise _unknown(key, list(_COMMON), _where(key, value, homes, _named(base, layers)))
    config = dataclasses.replace(base, **common, options=options)
    validate(config)
    return config


def _named(base: RunConfig, layers: tuple[dict[str, Any], ...]) -> tuple[str, str]:
    """The algorithm and dataset the layers name (the last one that does wins), for an error's hint."""
    named = {"algorithm": base.algorithm, "dataset": base.dataset}
    for layer in layers:
        named.update({key: value for key, value in layer.items() if key in named and isinstance(value, str)})
    return named["algorithm"], named["dataset"]


def validate(config: RunConfig) -> None:
    """Range checks that do not need the registries (those check names when they are used); each message
    names the value it refused."""
    c = config
    checks = [
        (c.clients >= 1, f"clients must be >= 1, got {c.clients}"),
        (c.rounds >= 1, f"rounds must be >= 1, got {c.rounds}"),
        (0.0 < c.fraction <= 1.0, f"fraction must be in (0, 1], got {c.fraction}"),
        (0.0 <= c.val_fraction < 1.0, f"val_fraction must be in [0, 1), got {c.val_fraction}"),
        (
            c.local_epochs >= 1 or c.local_steps >= 1,
            f"local_epochs or local_steps must be >= 1, got local_epochs = {c.local_epochs} and "
            f"local_steps = {c.local_steps}",
        ),
        (c.local_steps >= 0, f"local_steps must be >= 0, got {c.local_steps}"),
        (c.batch_size >= 1, f"batch_size must be >= 1, got {c.batch_size}"),
        (c.lr > 0, f"lr must be > 0, got {c.lr}"),
        (c.momentum >= 0, f"momentum must be >= 0, got {c.momentum}"),
        (c.weight_decay >= 0, f"weight_decay must be >= 0, got {c.weight_decay}"),
        (c.group_norm_groups >= 1, f"group_norm_groups must be >= 1, got {c.group_norm_groups}"),
        (c.eval_every >= 1, f"eval_every must be >= 1, got {c.eval_every}"),
        (c.checkpoint_every >= 1, f"checkpoint_every must be >= 1, got {c.checkpoint_every}"),
        (c.min_clients >= 1, f"min_clients must be >= 1, got {c.min_clients}"),
        (
            c.min_clients <= c.clients,
            f"min_clients = {c.min_clients} is more than clients = {c.clients}; no round could go on",
        ),
        (c.timeout >= 0, f"timeout must be >= 0, got {c.timeout}"),
        (
            math.isfinite(c.connect_timeout) and c.connect_timeout > 0,
            f"connect_timeout must be a finite number > 0, got {c.connect_timeout}",
        ),
        (c.max_message_mb > 0, f"max_message_mb must be > 0, got {c.max_message_mb}"),
        (c.threads >= 0, f"threads = {c.threads}: use 0 (torch's default) or a positive number of threads"),
        (
            c.threads <= MAX_THREADS,
            f"threads = {c.threads}: at most {MAX_THREADS} (more than any CPU has cores; each thread is an "
            "OS thread, and a count this large exhausts memory)",
        ),
        (
            0 <= c.seed <= MAX_SEED,
            f"seed = {c.seed}: use a whole number in 0..{MAX_SEED} (TOML integers are signed 64-bit, and "
            "config.toml must hold the seed)",
        ),
        (c.augment in ("auto", "on", "off"), f"augment must be auto, on or off, got {c.augment!r}"),
        (
            c.val_mode in ("auto", "random", "tail", "subjects"),
            f"val_mode must be auto, random, tail or subjects, got {c.val_mode!r}",
        ),
        (
            c.private_init in ("shared", "client"),
            f"private_init must be shared or client, got {c.private_init!r}",
        ),
        (c.optimizer in ("sgd", "adam"), f"optimizer must be sgd or adam, got {c.optimizer!r}"),
        (
            c.transport in ("inprocess", "flower"),
            f"transport must be inprocess or flower, got {c.transport!r}",
        ),
        (bool(c.algorithms), f"algorithm must name at least one algorithm, got {c.algorithm!r}"),
        (
            len(set(c.algorithms)) == len(c.algorithms),
            f"algorithm = {c.algorithm!r} names an algorithm twice; each runs once, in its own folder",
        ),
        (
            all(name in TRACKERS for name in tracker_names(c.track))
            and bool(tracker_names(c.track)) == bool(c.track.strip()),  # "," names no tracker
            f"track = {c.track!r}: valid values are empty, {', '.join(TRACKERS)}, or {','.join(TRACKERS)}",
        ),
    ]
    for ok, message in checks:
        if not ok:
            raise ConfigError(message)


def options_for(
    config: RunConfig, name: str, options_type: type, homes: Homes | None = None, run: RunConfig | None = None
) -> Any:
    """The algorithm's options dataclass filled from `config.options[name]`, every key checked; a key another
    table of `homes` takes is said to belong there, the tables `run` (default: `config`) uses first."""
    given = dict(config.options.get(name, {}))
    known = {f.name: f for f in fields(options_type)}
    values = {}
    for key, value in given.items():
        if key in _COMMON and key not in known:
            raise ConfigError(
                f"{name}.{key}: {key} is a common key that every algorithm of a run shares; set it outside "
                f"the table (an algorithm's table may set only {', '.join(sorted(PER_ALGORITHM_KEYS))})"
            )
        if key not in known:
            named = ((run or config).algorithm, (run or config).dataset)
            where = _where(key, value, homes, named, table=name)
            where = f"{name} has no option {key}; {where}" if where else ""
            raise _unknown(f"{name}.{key}", [f"{name}.{k}" for k in [*known, *PER_ALGORITHM_KEYS]], where)
        values[key] = _check_value(f"{name}.{key}", value, known[key].type)
    options = options_type(**values)
    check = getattr(options, "validate", None)
    if check is not None:
        check()
    return options


def check_dataset_table(
    config: RunConfig, takes: Collection[str], homes: Homes | None = None, table: str = ""
) -> None:
    """A key of the dataset's table (named as written: `table`, an alias such as fmnist) that the dataset does
    not take (`takes`) but another table of `homes` or the top level does is refused naming where it goes."""
    name = config.dataset
    written = table or name
    alias = "" if written == name else f" ([{written}] is the table of dataset {name} under an alias)"
    for key, value in config.options.get(name, {}).items():
        if key in takes:
            continue
        if key in _COMMON:
            raise ConfigError(
                f"{written}.{key}: {key} is a common key, not an option of dataset {name}{alias}: write "
                f"{key}={toml_literal(value)} at the top level, outside [{written}]"
            )
        where = _where(key, value, homes, (config.algorithm, name), table=name)
        if where:
            raise ConfigError(
                f"unknown config key '{written}.{key}': dataset {name} has no option {key}{alias}; {where}"
            )


#: Common keys an algorithm's table may override for that algorithm alone (per-method settings).
PER_ALGORITHM_KEYS = frozenset(
    {"model", "rounds", "local_epochs", "local_steps", "batch_size", "optimizer", "lr", "momentum",
     "weight_decay", "augment", "norm", "recalibrate_norm"}
)  # fmt: skip


def for_algorithm(config: RunConfig, name: str) -> RunConfig:
    """The config of one algorithm of a suite: its table's common keys (e.g. `[fedprox] lr`) win."""
    section = dict(config.options.get(name, {}))
    common = {key: section.pop(key) for key in list(section) if key in PER_ALGORITHM_KEYS}
    common = {key: _check_value(f"{name}.{key}", value, _COMMON[key].type) for key, value in common.items()}
    options = {k: v for k, v in config.options.items() if k != name}
    if section:
        options[name] = section
    try:
        return build_config(config.replace(algorithm=name, options=options), common)
    except ConfigError as exc:  # the run's own keys were valid: a key of this table is out of range
        if not common:
            raise
        given = ", ".join(f"{name}.{key} = {value!r}" for key, value in common.items())
        raise ConfigError(f"{given}: {exc}") from None


def write_config(config: RunConfig, path: Path) -> None:
    """Write the config as TOML (a run's config.toml)."""
    from fedistill import disk

    disk.write_text(path, tomli_w.dumps(config.to_dict()))


def read_config(path: Path) -> RunConfig:
    """The config a run directory's config.toml holds, over the defaults."""
    return build_config(RunConfig(), load_toml(path))
