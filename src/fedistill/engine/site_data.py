"""Sites that hold only their own records (`site_data_dir`), as a consortium's hospitals do.

By default every site (and the server) loads the whole dataset and cuts its shard from it, which is right for
a simulation and wrong for a deployment: a hospital has its own scans, not everyone's. With `site_data_dir`
set, site k reads its own folder (`{site}` in the path becomes k; on a Flower SuperNode its node config's
`data-dir` wins), laid out as the dataset's loader expects, and keeps all of its training records but a
`val_fraction` holdout; its test part is its own local test set. The server reads `data_dir` for the test set
it scores every model on and holds out `val_fraction` of that folder's training part as its validation split.
The data are already partitioned, so `partition`, `alpha` and `[partition_options]` do not apply.

Every model must see inputs normalised the same way, so a site takes the server's dataset facts (class names,
image size, channels, mean and std) after checking that its own agree on everything but the statistics. Models
that never leave a site (Standalone's, FedMD's, FedIOD's teachers) are scored by the evaluation harness on the
server's test set, at the site, as in every other run; so on Flower the server's start-up HELLO carries
its dataset facts and its test set (inputs, labels, the facts per-volume metrics need) to every node, once,
under the content kind `evaluation-set` in the ledger, and each node keeps them on its storage. In-process the
sites are handed the same objects.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedistill.config import RunConfig
from fedistill.data.base import DatasetInfo, ImageSet, LoadedDataset
from fedistill.data.catalog import DATASETS
from fedistill.data.partition import FederatedSplit, make_split, save_split
from fedistill.data.registry import canonical_dataset_name, load_dataset
from fedistill.engine.prepared import Prepared
from fedistill.errors import ConfigError, DataError
from fedistill.federation.messages import HELLO, Message
from fedistill.seeding import derive_seed
from fedistill.tasks import task_class

#: The placeholder in `site_data_dir` that becomes each site's number.
SITE = "{site}"
#: The content kind of the server's test set in the transport's start-up HELLO, and its config scalars' names.
EVALUATION_SET = "evaluation-set"
DATASET_INFO = "dataset_info"
GROUP_NAMES = "group_names"
#: The dataset facts a site's own data must share with the server's; the rest (mean, std) it takes from them.
AGREED = ("name", "task", "channels", "image_size", "num_classes", "class_names", "text")
#: For each dataset whose sites take the server's classes when the config names none: how its loader's line
#: about the option `classes` reads once they are the server's, where the server's come from, and the order
#: in which the option lists them.
SERVER_CLASSES = {
    "image-folder": (
        {"in the option classes": "among the server's classes"},
        "its data_dir's train/ folders (its test/ folders where it has no train/)",
        "in label order",
    ),
    "mask-folder": (
        {"there are": "the server has", "; name them all in the option classes, by value": ""},
        "the largest value in its data_dir's training masks (its test masks where it has no train/)",
        "by value",
    ),
    "nifti-folder": (
        {"there are": "the server has", "; name them all in the option classes, by value": ""},
        "its data_dir's dataset.json or the largest value in its training label volumes",
        "by value",
    ),
}


def own_data(config: RunConfig) -> bool:
    """Whether the run's sites hold only their own records (`site_data_dir` set)."""
    return bool(config.site_data_dir)


def site_folder(config: RunConfig, site: int, node_dir: str | None = None) -> Path:
    """Where site `site` reads its records: the node's own `data-dir` when it has one, else `site_data_dir`
    with `{site}` replaced by the site's number."""
    if node_dir:
        return Path(node_dir).expanduser()
    return Path(config.site_data_dir.replace(SITE, str(site))).expanduser()


def check_site_data(config: RunConfig, *, per_node_folders: bool = False) -> None:
    """What `site_data_dir` rules out before any data are read: a partition's keys (the folders are the
    partition), a dataset that reads no files (every site would hold the same records), and, where the
    sites' folders come from the path alone (in-process, a Flower simulation), a path without `{site}`
    (several sites would read one folder) and a site folder that is not there. `per_node_folders`: a Flower
    deployment, whose nodes may each name their own folder."""
    if not own_data(config):
        return
    defaults = RunConfig()
    for key in ("partition", "alpha"):  # set, they would seem to shape sites whose folders are given
        if getattr(config, key) != getattr(defaults, key):
            raise ConfigError(
                f"{key} = {getattr(config, key)!r} does not apply with site_data_dir: each site's folder is "
                "its part of the data; leave partition, alpha and [partition_options] out"
            )
    if config.options.get("partition_options"):
        raise ConfigError(
            "[partition_options] does not apply with site_data_dir: each site's folder is its part of the "
            "data; leave the table out"
        )
    name = canonical_dataset_name(config.dataset)
    entry = DATASETS.get(name)
    if entry is not None and entry.subdir is None:
        raise ConfigError(
            f"site_data_dir: dataset {name!r} reads no files, so every site would hold the same records; "
            "sites with their own data need a dataset read from files (image-folder, for a site's own images)"
        )
    if SITE not in config.site_data_dir and not per_node_folders and config.clients > 1:
        path = Path(config.site_data_dir)
        number = re.search(r"\d+$", path.name)  # one site's folder, e.g. sites/site-0
        example = path.parent / (path.name[: number.start()] + SITE) if number else path / "site-{site}"
        raise ConfigError(
            f"site_data_dir = {config.site_data_dir!r} has no {SITE}, so every site would read the same "
            f"folder; write e.g. {str(example)!r} (site 0 reads {str(example).replace(SITE, '0')!r}), or "
            "give each Flower node its own data-dir"
        )
    for site in range(0 if per_node_folders else config.clients):
        if not site_folder(config, site).is_dir():
            raise DataError(
                f"site {site}'s folder {site_folder(config, site)} does not exist "
                f"(site_data_dir = {config.site_data_dir!r})"
            )


def agreed_info(own: DatasetInfo, server: DatasetInfo, where: str) -> DatasetInfo:
    """The server's dataset facts, for a site whose own data agree with them on everything but the
    normalisation statistics (`AGREED`); one line naming the first difference otherwise."""
    for key in AGREED:
        mine, theirs = getattr(own, key), getattr(server, key)
        if mine != theirs:
            raise DataError(
                f"{where} holds data unlike the server's: {key} {_shown(mine)} against the server's "
                f"{_shown(theirs)}; every site's folder must hold the same kind of data as the server's "
                "data_dir (the same classes, image size and channels)"
            )
    return server


def _shown(value: object) -> str:
    """A dataset fact as a line shows it: a long class list cut after its first names."""
    if isinstance(value, tuple) and len(value) > 6:
        return repr(value[:6])[:-1] + f", ... ({len(value)} in all))"
    return repr(value)


def load_site(config: RunConfig, site: int, server: DatasetInfo, folder: Path | None = None) -> Prepared:
    """Site `site`'s own data (from `folder`, else `site_folder`), with the server's dataset facts and a
    one-site split: all its training records but a `val_fraction` holdout, and its whole test part."""
    folder = folder or site_folder(config, site)
    where = f"site {site}'s folder {folder}"
    if not folder.is_dir():
        named = f"site_data_dir = {config.site_data_dir!r}"
        if folder != site_folder(config, site):  # a Flower node's own data-dir
            named = "its node config's data-dir; the run's site_data_dir is not read where a node has one"
        raise DataError(f"{where} does not exist ({named})")
    name = canonical_dataset_name(config.dataset)
    options = dict(config.options.get(config.dataset, config.options.get(name, {})))
    classes_from_server = "classes" in DATASETS[name].options and "classes" not in options
    if classes_from_server:
        options["classes"] = list(server.class_names)  # a site may have no case of some class
    try:  # the site's own records: no published file's md5 can match them (their format is still checked)
        dataset = load_dataset(name, folder, download=False, verify=False, **options)
    except DataError as exc:  # named with the site: a loader's line may not say which folder it read
        line = str(exc)
        # the server's classes stood in for an option the user did not set: the line says so
        if classes_from_server and "the option classes" in line:
            rewrites, source, order = SERVER_CLASSES[name]
            for said, meant in rewrites.items():
                line = line.replace(said, meant, 1)
            line += (
                f"; the server's come from {source}: where they lack a class, set "
                f"{config.dataset}.classes to every class name, {order}"
            )
        raise DataError(f"{where}: {line}") from None
    dataset = dataclasses.replace(dataset, info=agreed_info(dataset.info, server, where))
    if not len(dataset.train):
        raise DataError(f"{where} holds no training records; give the site some, or leave it out (clients)")
    task = task_class(dataset.info)
    train_labels, test_labels, num_labels = task.partition_labels(dataset)
    one_part = own_split_config(config)  # one part holding everything: the holdout is the only cut
    split = make_split(
        train_labels,
        test_labels,
        1,
        method=one_part.partition,
        alpha=None,
        seed=derive_seed(config.seed, "site", site),
        num_classes=num_labels,
        val_fraction=config.val_fraction,
        val_mode=validation_mode(one_part, task.per_pixel),  # per-pixel sets: whole subjects of its own
        subjects=dataset.train_subject_ids,
    )
    return Prepared(dataset, split)


def own_split_config(config: RunConfig) -> RunConfig:
    """The config a party splits its own data with (the server, and each site in load_site): one `natural`
    part holding every record, so that the validation holdout is the only cut, of whole subjects on a
    per-pixel set (`validation_mode`), as a natural site's (the partition is where the data live)."""
    options = {**config.options, "partition_options": {}}
    return config.replace(clients=1, partition="natural", site_data_dir="", options=options)


def test_alone_split(
    config: RunConfig, test_labels: np.ndarray, num_labels: int, val_mode: str
) -> FederatedSplit:
    """The server's split where its folder holds a test set alone (`val_fraction = 0`): no training record
    to hold out or keep, its whole test set its one part's."""
    empty = np.zeros(0, dtype=np.int64)
    return FederatedSplit(
        method="natural",
        alpha=None,
        seed=derive_seed(config.seed, "partition"),
        num_classes=int(num_labels),
        client_train=[empty],
        client_val=[empty],
        server_val=empty,
        client_test=[np.arange(len(test_labels), dtype=np.int64)],
        train_counts=np.zeros((1, int(num_labels)), dtype=np.int64),
        val_fraction=0.0,
        val_mode=val_mode,
    )


def validation_mode(config: RunConfig, per_pixel: bool) -> str:
    """`val_mode = "auto"`: whole subjects of each site where the sites are a per-pixel set's natural
    groups (neighbouring slices of one subject are nearly the same sample), else a random holdout."""
    if config.val_mode != "auto":
        return config.val_mode
    return "subjects" if per_pixel and config.partition == "natural" else "random"


def pooled(sites: list[Prepared]) -> ImageSet:
    """Every site's training records in one set, in site order (a pooled baseline's data, in-process)."""
    parts = [site.dataset.train.subset(site.split.client_train[0]) for site in sites]
    return ImageSet(torch.cat([p.x for p in parts]), torch.cat([p.y for p in parts]))


def site_greeting(dataset: LoadedDataset) -> Message:
    """The server's HELLO to sites with their own data: its test set with the per-sample facts its metrics
    need (`evaluation-set`), and its dataset facts and test-source names (config scalars)."""
    arrays = {"x": dataset.test.x.numpy(), "y": dataset.test.y.numpy()}
    arrays.update({f"meta.{key}": np.asarray(value) for key, value in dataset.test_meta.items()})
    if dataset.test_groups is not None:
        arrays["groups"] = np.asarray(dataset.test_groups)
    config = {DATASET_INFO: dataset.info.to_json(), GROUP_NAMES: json.dumps(list(dataset.group_names))}
    return Message.build(HELLO, arrays={EVALUATION_SET: arrays}, scalars={"config": config})


def _own_tensor(value: Any) -> torch.Tensor:
    """A tensor of its own: a copy of a received message's read-only array; a tensor as it is."""
    return value if isinstance(value, torch.Tensor) else torch.from_numpy(np.array(value))


def harness_from(arrays: dict[str, Any], config: dict[str, Any]) -> LoadedDataset:
    """The server's dataset facts and test set, as `site_greeting` sent them (no training records)."""
    info = DatasetInfo.from_json(str(config[DATASET_INFO]))
    tensors = {name: _own_tensor(value) for name, value in arrays.items()}
    test = ImageSet(tensors["x"], tensors["y"])
    return LoadedDataset(
        info=info,
        train=ImageSet(test.x[:0], test.y[:0]),
        test=test,
        test_groups=tensors["groups"].numpy() if "groups" in tensors else None,
        group_names=tuple(json.loads(str(config.get(GROUP_NAMES, "[]")))),
        test_meta={name[5:]: value.numpy() for name, value in tensors.items() if name.startswith("meta.")},
    )


#: The file in a run folder holding each site's data fingerprint (in-process from the sites' data, on Flower
#: from their nodes' start-up HELLO answers), so that a resume finds a site whose folder changed (the saved
#: partition is the server's data alone).
SITES_FILE = "sites.json"


def fingerprint(records: str, split: str | None) -> str:
    """A site's fingerprint: the hash of its training records and that of its split of them."""
    return f"{records}:{split}"


def site_fingerprints(data: Prepared) -> list[str]:
    """Each site's training records and split, as one hash per site (in-process sites only)."""
    return [fingerprint(site.records_hash, site.split.hash()) for site in data.sites or []]


def save_sites(data: Prepared, run_dir: Path) -> None:
    """Record the sites' fingerprints beside the saved partition, where this process holds the sites."""
    if data.sites is not None:
        _write_sites(site_fingerprints(data), run_dir)


def check_sites(data: Prepared, run_dir: Path) -> None:
    """A resume's sites hold what they held when the run began; else one line naming the first that
    changed (a site's records or the split of them)."""
    if data.sites is not None:
        _compare_sites(site_fingerprints(data), run_dir)


def node_sites(config: RunConfig, data: Prepared, run_dir: Path, fleet: Any, *, resumed: bool) -> None:
    """On Flower, the sites as their nodes answered the start-up HELLO (`fleet.site_hashes`: the hashes of
    each site's records and split, in partition order; `fleet.site_sizes`): their fingerprints recorded
    with their counts when the run begins, and on a resume compared with those it began with, as
    `check_sites` compares an in-process run's."""
    found = [fingerprint(records, split) for records, split in fleet.site_hashes]
    if resumed:
        _compare_sites(found, run_dir)
    else:
        _write_sites(found, run_dir)
        save_partition(config, data, run_dir, fleet.site_sizes)


def save_partition(config: RunConfig, data: Prepared, run_dir: Path, sizes: list[int] | None = None) -> None:
    """The run's `partition.npz` and `partition.json`: the split as it always was, or, where the sites hold
    their own records, what a user needs to know of them (`own_partition`) around the server's split."""
    save_split(data.split, run_dir, own_partition(config, data, sizes) if data.own_data else None)


def own_partition(config: RunConfig, data: Prepared, sizes: list[int] | None = None) -> dict[str, Any]:
    """What `partition.json` says of sites holding their own records: each site's training, validation and
    local test counts and its class counts where this process read the sites (`sizes`: the training counts
    the Flower nodes reported; what no process here counted is null), and the server's validation and test
    counts; the server's own split (the one the resume checks) is its `split`."""
    sites, split = data.sites, data.split
    counts = data.train_counts() if not task_class(data.dataset.info).per_pixel else None
    return {
        "format": "fedistill-partition",
        "version": 1,
        "method": "own-data",
        "alpha": None,
        "num_classes": split.num_classes,
        "num_clients": config.clients,
        "site_data_dir": config.site_data_dir,
        "val_fraction": split.val_fraction,
        "val_mode": split.val_mode,
        "hash": split.hash(),
        "client_train_sizes": data.client_sizes() or sizes,
        "client_val_sizes": None if sites is None else [int(s.split.client_val[0].size) for s in sites],
        "client_test_sizes": None if sites is None else [int(s.split.client_test[0].size) for s in sites],
        "server_train_size": int(split.client_train[0].size),
        "server_val_size": int(split.server_val.size),
        "server_test_size": len(data.dataset.test),
        "train_counts": None if counts is None else counts.tolist(),
    }


def _write_sites(fingerprints: list[str], run_dir: Path) -> None:
    (run_dir / SITES_FILE).write_text(json.dumps(fingerprints), encoding="utf-8")


def _compare_sites(fingerprints: list[str], run_dir: Path) -> None:
    """One line naming the first site whose fingerprint is not the one recorded when the run began (a run
    folder from before the record passes)."""
    path = run_dir / SITES_FILE
    if not path.exists():
        return
    saved = json.loads(path.read_text(encoding="utf-8"))
    for k, (before, now) in enumerate(zip(saved, fingerprints, strict=False)):
        if before != now:
            raise ConfigError(
                f"{run_dir}: site {k}'s records differ from those the run began with; cannot resume. Put "
                f"site {k}'s folder back as it was, or start a new run (another --name) on the records as "
                "they are now"
            )
    if len(saved) != len(fingerprints):
        raise ConfigError(f"{run_dir}: the run began with {len(saved)} sites, not {len(fingerprints)}")


def checked_greeting(dataset: LoadedDataset, max_message_mb: float) -> Message:
    """The server's start-up message to sites with their own data (`site_greeting`), held to
    `max_message_mb` like every message: one line saying how large it is, before anything is written."""
    greeting = site_greeting(dataset)
    if greeting.nbytes > max_message_mb * 2**20:
        raise ConfigError(
            f"the server's test set, which its start-up message carries to every site holding its own data, "
            f"is {greeting.nbytes / 2**20:.2f} MiB, over max_message_mb = {max_message_mb:g}: raise it"
        )
    return greeting
