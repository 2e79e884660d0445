"""The full federated split of one experiment, its hash, and its two files (``partition.npz`` and
``partition.json``)."""

from __future__ import annotations

import hashlib
import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fedistill import disk
from fedistill.data.partition.checks import as_labels, check_seed
from fedistill.data.partition.holdout import class_counts, holdout, iid_shards, subject_holdout
from fedistill.data.partition.registry import get_partitioner
from fedistill.errors import DataError, UserError, unknown_name

_SPLIT_FORMAT = "fedistill-partition"
_SPLIT_VERSION = 1
_VAL_MODES = ["random", "subjects", "tail"]  # a config's "auto" is resolved before a split is made


@dataclass
class FederatedSplit:
    """Who holds which sample, for one experiment.

    ``client_train``, ``client_val`` and ``server_val`` index the original training set (``client_val``
    are IID shards of the held-out ``server_val``); ``client_test`` indexes the test set.
    """

    method: str
    alpha: float | None
    seed: int
    num_classes: int
    client_train: list[np.ndarray]
    client_val: list[np.ndarray]
    server_val: np.ndarray
    client_test: list[np.ndarray]
    train_counts: np.ndarray
    options: dict[str, Any] = field(default_factory=dict)
    val_fraction: float = 0.1
    val_mode: str = "random"

    @property
    def num_clients(self) -> int:
        """How many clients the data are split among."""
        return len(self.client_train)

    def parameters(self) -> dict[str, Any]:
        """Everything that, together with the data, determines the split."""
        return {
            "method": self.method,
            "alpha": self.alpha,
            "seed": self.seed,
            "num_classes": self.num_classes,
            "num_clients": self.num_clients,
            "options": self.options,
            "val_fraction": self.val_fraction,
            "val_mode": self.val_mode,
        }

    def arrays(self) -> list[tuple[str, np.ndarray]]:
        """All index and count arrays, named, in the canonical order used for files and the hash."""
        named = [(f"client_train_{k}", a) for k, a in enumerate(self.client_train)]
        named += [(f"client_val_{k}", a) for k, a in enumerate(self.client_val)]
        named.append(("server_val", self.server_val))
        named += [(f"client_test_{k}", a) for k, a in enumerate(self.client_test)]
        named.append(("train_counts", self.train_counts))
        return [(name, np.ascontiguousarray(a, dtype="<i8")) for name, a in named]

    def hash(self) -> str:
        """SHA-256 over the parameters and every array (little-endian int64, with names and shapes)."""
        digest = hashlib.sha256()
        digest.update(json.dumps(self.parameters(), sort_keys=True).encode())
        for name, array in self.arrays():
            digest.update(f"\n{name}{array.shape}\n".encode())
            digest.update(array.tobytes())
        return digest.hexdigest()

    def to_json(self) -> dict[str, Any]:
        """Sizes, per-class counts, parameters and hash; no indices."""
        return {
            "format": _SPLIT_FORMAT,
            "version": _SPLIT_VERSION,
            **self.parameters(),
            "hash": self.hash(),
            "client_train_sizes": [int(a.size) for a in self.client_train],
            "client_val_sizes": [int(a.size) for a in self.client_val],
            "server_val_size": int(self.server_val.size),
            "client_test_sizes": [int(a.size) for a in self.client_test],
            "train_counts": self.train_counts.tolist(),
        }


def make_split(
    train_labels: Any,
    test_labels: Any,
    num_clients: int,
    *,
    method: str,
    alpha: float | None,
    seed: int,
    num_classes: int,
    val_fraction: float = 0.1,
    val_mode: str = "random",
    subjects: Any = None,
    **options: Any,
) -> FederatedSplit:
    """Hold out a validation set, partition the rest, and shard the holdout and the test set IID.

    ``val_mode="subjects"`` (natural partitions of per-pixel sets) partitions first and holds out whole
    subjects of each site (a slab where a site is one volume) as its validation split (`subject_holdout`);
    ``subjects`` (one per training sample: its volume or whole image) lets a site that is one source of
    many subjects hold out whole ones of them. Other modes ignore it.

    The holdout, the partition and the two shardings each get their own stream derived from ``seed``
    (``numpy.random.SeedSequence``), so changing one stage's size does not shift another's draws.
    """
    partitioner = get_partitioner(method)
    if val_mode not in _VAL_MODES:
        raise unknown_name("val_mode", val_mode, _VAL_MODES)
    seed = check_seed(seed)
    y_train = as_labels(train_labels, num_classes, "train_labels")
    y_test = as_labels(test_labels, num_classes, "test_labels")
    s_hold, s_part, s_val, s_test = (int(s) for s in np.random.SeedSequence(seed).generate_state(4))
    if val_mode == "subjects":
        if method != "natural":
            raise UserError(
                f"val_mode = 'subjects' holds out each site's own subjects and needs partition = "
                f"'natural' (got {method!r}); use val_mode = 'random'"
            )
        parts = partitioner(
            y_train, num_clients, alpha=alpha, seed=s_part, num_classes=num_classes, **options
        )
        client_train, client_val = subject_holdout(
            y_train, parts, val_fraction, seed=s_hold, subjects=subjects
        )
        held = np.sort(np.concatenate(client_val)) if client_val else np.zeros(0, dtype=np.int64)
    else:
        train_pos, held = holdout(y_train, val_fraction, seed=s_hold, mode=val_mode)
        parts = partitioner(
            y_train[train_pos], num_clients, alpha=alpha, seed=s_part, num_classes=num_classes, **options
        )
        client_train = [train_pos[p] for p in parts]
        client_val = [held[s] for s in iid_shards(y_train[held], num_clients, seed=s_val)]
    return FederatedSplit(
        method=method,
        alpha=None if alpha is None else float(alpha),
        seed=seed,
        num_classes=int(num_classes),
        client_train=client_train,
        client_val=client_val,
        server_val=held,
        client_test=iid_shards(y_test, num_clients, seed=s_test, what="test"),
        train_counts=class_counts(y_train, client_train, num_classes),
        options={key: np.asarray(value).item() for key, value in options.items()},
        val_fraction=float(val_fraction),
        val_mode=val_mode,
    )


def save_split(split: FederatedSplit, directory: str | Path, described: dict[str, Any] | None = None) -> None:
    """Write ``partition.npz`` (int64 index arrays) and ``partition.json`` (sizes, counts, hash).
    `described`: what ``partition.json`` says instead where the data were partitioned before the run (sites
    holding their own records: each site's counts), with the split's own record under its key ``split``."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    np.savez(buffer, **dict(split.arrays()))
    disk.write_bytes(directory / "partition.npz", buffer.getvalue())
    meta = split.to_json() if described is None else {**described, "split": split.to_json()}
    disk.write_text(directory / "partition.json", json.dumps(meta, indent=1) + "\n")


def load_split(directory: str | Path) -> FederatedSplit:
    """Read a split written by ``save_split`` and check that the arrays still match the recorded hash."""
    directory = Path(directory)
    meta_path, npz_path = directory / "partition.json", directory / "partition.npz"
    for path in (meta_path, npz_path):
        if not path.is_file():
            raise DataError(f"{path} does not exist; create the split first (save_split)")
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        meta = meta.get("split", meta)  # a described partition keeps the split's record there (save_split)
        k = int(meta["num_clients"])
        with np.load(npz_path, allow_pickle=False) as npz:
            arrays = {name: npz[name].astype(np.int64) for name in npz.files}
        split = FederatedSplit(
            method=meta["method"],
            alpha=meta["alpha"],
            seed=meta["seed"],
            num_classes=meta["num_classes"],
            client_train=[arrays[f"client_train_{i}"] for i in range(k)],
            client_val=[arrays[f"client_val_{i}"] for i in range(k)],
            server_val=arrays["server_val"],
            client_test=[arrays[f"client_test_{i}"] for i in range(k)],
            train_counts=arrays["train_counts"],
            options=meta["options"],
            val_fraction=meta["val_fraction"],
            val_mode=meta["val_mode"],
        )
    except (KeyError, TypeError, ValueError, OSError) as exc:
        raise DataError(
            f"the split in {directory} is incomplete or corrupt ({type(exc).__name__}: {exc}); "
            "delete partition.npz and partition.json and create the split again"
        ) from exc
    actual = split.hash()
    if actual != meta.get("hash"):
        raise DataError(
            f"partition.npz in {directory} does not match partition.json (hash {actual[:12]}... != "
            f"{str(meta.get('hash'))[:12]}...); the files were modified or come from different splits: "
            "delete both and create the split again"
        )
    return split
