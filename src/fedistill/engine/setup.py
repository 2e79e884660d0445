"""What a run is made of, resolved once: the data and its partition, each algorithm with its own
config and options, the task, and every site's private context. Everything a user's input can get
wrong is checked here, before a run writes anything.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedistill import devices
from fedistill.algorithms.base import Algorithm, ClientContext
from fedistill.algorithms.registry import algorithm_names, for_task, get_algorithm
from fedistill.algorithms.shared.option_checks import check_model_names, named_models
from fedistill.algorithms.shared.training import task_of
from fedistill.config import RunConfig, check_dataset_table, for_algorithm, options_for
from fedistill.data.base import LoadedDataset
from fedistill.data.medical.nifti_folder import NAME as NIFTI_FOLDER
from fedistill.data.partition import make_split
from fedistill.data.registry import canonical_dataset_name, dataset_options, load_dataset
from fedistill.engine import norm_statistics
from fedistill.engine.key_homes import key_homes
from fedistill.engine.prepared import Prepared
from fedistill.engine.site_data import (
    check_site_data,
    checked_greeting,
    load_site,
    own_data,
    own_split_config,
    pooled,
    test_alone_split,
    validation_mode,
)
from fedistill.engine.tracking import trackers_for
from fedistill.errors import ConfigError, DataError, PartitionError, UserError, unknown_name
from fedistill.models import check_model_norm, check_model_options, model_names
from fedistill.seeding import derive_seed
from fedistill.tasks import Task, task_class

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Resolved:
    """One algorithm of a run: the algorithm, its own config (its table's common keys applied, e.g.
    `[fedprox] lr`) and its options dataclass, every key checked."""

    algorithm: Algorithm
    config: RunConfig
    options: Any


def resolve(config: RunConfig, name: str) -> Resolved:
    """The one place a run's algorithm name becomes an algorithm, a config and options."""
    algorithm = get_algorithm(name)
    own = for_algorithm(config, name)
    return Resolved(algorithm, own, options_for(own, name, algorithm.options, homes=key_homes, run=config))


def refuse_unused(config: RunConfig, algorithm: Algorithm, *, resume: bool = False) -> None:
    """A common key set in the algorithm's own table that it never reads (`Algorithm.unused_keys`) is a
    mistake: the user meant it for this algorithm, and it would change nothing. A resume only warns: a run
    begun before the refusal ran with the key ignored, and removing it would change its recorded settings."""
    name, table = algorithm.name, config.options.get(algorithm.name, {})
    for key, why in algorithm.unused_keys.items():
        if key in table:
            message = f"{name}.{key} is not used by {name}: {why.format(name=name)}"
            if resume:
                log.warning("%s; it stays ignored, as when the run began", message)
                continue
            raise ConfigError(
                f"{message}; remove it from [{name}] (a top-level {key} still serves the run's other "
                "algorithms)"
            )


def note_unused(config: RunConfig) -> None:
    """One INFO line naming the top-level common keys, set away from their defaults, that a running
    algorithm never reads: allowed (they serve the suite's other algorithms), but worth knowing."""
    defaults, notes = RunConfig(), []
    for name in config.algorithms:
        for key, why in get_algorithm(name).unused_keys.items():
            if getattr(config, key) != getattr(defaults, key):
                notes.append(
                    f"{key} = {getattr(config, key)!r} is not read by {name} ({why.format(name=name)})"
                )
    if notes:
        log.info("%s", "; ".join(notes))


#: Sections of `config.options` that are not algorithm names.
NON_ALGORITHM_SECTIONS = {"partition_options", "task", "model_options"}


def source_names(dataset: LoadedDataset) -> list[str] | None:
    """Each test sample's source (site, organ, dataset) by name, for per-source metrics; None without."""
    if dataset.test_groups is None:
        return None
    names = dataset.group_names
    return [names[g] if 0 <= g < len(names) else str(g) for g in np.asarray(dataset.test_groups).tolist()]


def score_first(
    task: Task, dataset: LoadedDataset, outputs: torch.Tensor, sources: list[str] | None
) -> dict[str, float]:
    """The task's metrics of `outputs` on the first len(outputs) test samples (evaluation harness)."""
    n, test = len(outputs), dataset.test
    subset = test if n == len(test) else test.subset(torch.arange(n))
    meta = {key: np.asarray(value)[:n] for key, value in dataset.test_meta.items()}
    groups = None if sources is None else sources[:n]
    return task.score(outputs, subset, dataset.info, meta=meta, groups=groups)


def _dataset_of(name: str) -> str | None:
    """The registered dataset `name` spells (an alias, another case), None when it names none."""
    try:
        return canonical_dataset_name(name)
    except UserError:
        return None


def canonical_dataset(config: RunConfig) -> RunConfig:
    """`config` with its dataset, and the dataset's options table, under the registered name (`sst-2`,
    `[sst-2]` -> `sst2`, `[sst2]`): the table is then found whichever spelling each used, and run names,
    summaries and config.toml spell it one way; a table under an alias is checked here, where the name it
    was written under is still known. A config that already does is returned as it is; an
    unknown name is left for the loader's error."""
    name = _dataset_of(config.dataset)
    if name is None:
        return config
    aliases = [section for section in config.options if section != name and _dataset_of(section) == name]
    if name == config.dataset and not aliases:
        return config
    tables = [section for section in config.options if section in (name, *aliases)]
    if len(tables) > 1:
        raise ConfigError(
            f"config tables {', '.join(f'[{t}]' for t in tables)} all set options of dataset {name!r}: "
            f"use one, [{name}]"
        )
    options = {section: values for section, values in config.options.items() if section not in aliases}
    if aliases:
        options[name] = config.options[aliases[0]]
    canonical = config.replace(dataset=name, options=options)
    if aliases:  # a misplaced key is named in the table the config wrote, not in one it never did
        check_dataset_table(canonical, dataset_options(name), key_homes, table=aliases[0])
    return canonical


def prepare_data(config: RunConfig) -> Prepared:
    """Load the run's dataset, with its options, and split it among the clients as the config says; with
    `site_data_dir`, the server's own data, split into its validation holdout and the rest, its files not
    checked against the published dataset's md5s (they are the deployment's own records); with
    `val_fraction = 0` the server's folder may hold a test set alone."""
    config = canonical_dataset(config)
    own = own_data(config)
    if own:
        config = own_split_config(config)
    options = config.options.get(config.dataset, {})
    dataset = load_dataset(
        config.dataset, config.data_dir, download=config.download, verify=not own, test_alone=own, **options
    )
    if own and not len(dataset.train) and config.val_fraction > 0:
        decathlon = config.dataset == NIFTI_FOLDER and (Path(config.data_dir) / "labelsTs").is_dir()
        folder = "imagesTr/ + labelsTr/ folders" if decathlon else "train/ folder"  # as its test set's layout
        raise DataError(
            f"the server's validation split (val_fraction = {config.val_fraction:g}) is cut from its "
            f"{folder} (its training records), and data_dir {config.data_dir} holds no training records: "
            "give it some, or set val_fraction = 0 (no method then selects on the server's validation split)"
        )
    task = task_class(dataset.info)
    train_labels, test_labels, num_labels = task.partition_labels(dataset)
    if own and not len(dataset.train):  # a test set alone: no holdout to cut, nothing else to split
        mode = validation_mode(config, task.per_pixel)
        return Prepared(dataset, test_alone_split(config, test_labels, num_labels, mode), own_data=True)
    spread = dataset.spread_over_sites(config.partition, config.clients)
    try:
        split = make_split(
            train_labels,
            test_labels,
            config.clients,
            method=config.partition,
            alpha=config.alpha,
            seed=derive_seed(config.seed, "partition"),
            num_classes=num_labels,
            val_fraction=config.val_fraction,
            val_mode=validation_mode(config, task.per_pixel),
            subjects=dataset.train_subject_ids,
            **config.options.get("partition_options", {}),
        )
    except PartitionError as e:
        if not spread:
            raise
        raise PartitionError(f"{e}; {spread}") from None
    if spread:
        log.warning("%s", spread)
    return Prepared(dataset, split, own_data=own)


def check_sections(config: RunConfig, *, resume: bool = False) -> None:
    """Every config table is an algorithm's, the dataset's or one of NON_ALGORITHM_SECTIONS, and every
    algorithm table is valid for its algorithm, whether or not it runs (a typo in another table is still a
    typo); `resume` only warns of a key the algorithm never reads (`refuse_unused`). A key of the dataset's
    table that belongs at the top level or in another table is named with where it goes."""
    config = canonical_dataset(config)
    algorithms = set(algorithm_names())
    for section in config.options:
        if section == config.dataset and _dataset_of(section) is not None:
            check_dataset_table(config, dataset_options(section), key_homes)
        if section in NON_ALGORITHM_SECTIONS or section == config.dataset:
            continue
        if _dataset_of(section) is not None:
            raise ConfigError(
                f"config table [{section}] sets options of dataset {section!r}, "
                f"but the run uses dataset {config.dataset!r}"
            )
        if section not in algorithms:
            valid = sorted(algorithms | NON_ALGORITHM_SECTIONS | {config.dataset})
            close = difflib.get_close_matches(section, valid, n=1)
            hint = f"; did you mean [{close[0]}]?" if close else ""
            raise ConfigError(
                f"unknown config table [{section}]{hint}; tables are algorithm names, the dataset's "
                f"name, [partition_options], [task] or [model_options] (valid: {', '.join(valid)})"
            )
        refuse_unused(config, get_algorithm(section), resume=resume)
        check_models(resolve(config, section))  # a table of an algorithm this run does not start, too


def check_models(resolved: Resolved) -> None:
    """Every model the algorithm builds, its `model` and those its options name (`model_keys`), offers the
    run's norm and takes its `[model_options]`; an option's model is named with the option."""
    own = resolved.config
    if own.model not in model_names():
        raise unknown_name("model", own.model, model_names(), ConfigError)
    norm, options = None if own.norm == "auto" else own.norm, own.options.get("model_options")
    check_model_norm(own.model, norm)
    check_model_options(own.model, options)
    # a misspelt name is unknown, not "of another task", whether or not the options' validate checked it
    check_model_names(resolved.algorithm.name, resolved.options, getattr(resolved.options, "model_keys", ""))
    for key, model in named_models(resolved.options):
        try:
            check_model_norm(model, norm)
            check_model_options(model, options)
        except ConfigError as exc:
            raise ConfigError(f"{resolved.algorithm.name}.{key}: {exc}") from None


def check_algorithm(resolved: Resolved) -> None:
    """What a running algorithm's setup can get wrong without the data: its models (`check_models`) and
    what its options rule out together with the run's common keys (the options' `check_run`, if any)."""
    check_models(resolved)
    norm_statistics.check_algorithm(resolved.config, resolved.algorithm, resolved.options)
    check_run = getattr(resolved.options, "check_run", None)
    if check_run is not None:
        check_run(resolved.config)


def validate_setup(config: RunConfig, *, resume: bool = False, simulation: bool = False) -> Prepared:
    """Everything a user's input can get wrong, checked before a run writes anything: names, config
    tables, every running algorithm's options, its models, the dataset files and the partition; `resume`:
    the config of a run folder (a mistake it already ran with may only be warned of). `simulation`: with
    transport = flower, this process starts Flower's simulation, whose nodes read `site_data_dir` alone
    (a deployment's SuperNodes may each name their own data-dir)."""
    config = canonical_dataset(config)
    check_sections(config, resume=resume)
    devices.resolve(config.device)  # a device this machine lacks is a mistake named before any work
    trackers_for(config)  # a tracker whose package is missing, too
    note_unused(config)
    running = {name: resolve(config, name) for name in config.algorithms}  # each resolved once, here
    for resolved in running.values():
        check_algorithm(resolved)
    on_flower = config.transport == "flower"
    check_site_data(config, per_node_folders=on_flower and not simulation)
    if own_data(config) and on_flower:
        for name, resolved in running.items():
            if resolved.algorithm.pooled:
                raise ConfigError(
                    f"{name} pools every site's records, and with site_data_dir they stay at the sites' "
                    "Flower nodes; run it in-process on folders you hold, or leave it out"
                )
    data = prepare_data(config)
    info = data.dataset.info
    task = task_of(config, info)
    check_sets(task, info, data.dataset, config.dataset)
    if own_data(config) and not on_flower:  # a Flower node loads its own site (engine/flower/node.py)
        data = Prepared(data.dataset, data.split, _load_sites(config, task, data), own_data=True)
    if own_data(config) and on_flower:  # the start-up message carries the server's test set
        data = dataclasses.replace(data, greeting=checked_greeting(data.dataset, config.max_message_mb))
    for name, resolved in running.items():
        algorithm, model = resolved.algorithm, resolved.config.model
        if task.name not in algorithm.tasks:
            fitting = for_task(task.name)
            runs_there = (
                f"algorithms for it: {', '.join(fitting)}"
                if fitting
                else "which no registered algorithm runs on (a method names its tasks in Algorithm.tasks)"
            )
            raise ConfigError(
                f"{name} runs on {', '.join(algorithm.tasks)} only, and dataset {config.dataset!r} is a "
                f"{task.name} task{'; ' if fitting else ', '}{runs_there}"
            )
        if model not in model_names(task.name):
            raise ConfigError(
                f"model {model!r} does not serve {task.name} (dataset {config.dataset!r}); "
                f"models that do: {', '.join(model_names(task.name))}"
            )
        for key, named in named_models(resolved.options):
            if named not in model_names(task.name):
                raise ConfigError(
                    f"{name}.{key} names model {named!r}, which does not serve {task.name} (dataset "
                    f"{config.dataset!r}); models that do: {', '.join(model_names(task.name))}"
                )
        check_task = getattr(resolved.options, "check_task", None)  # what the options rule out on it
        if check_task is not None:
            check_task(resolved.config, task, info)
    if config.augment == "on" and not task.usual_augment(info):
        log.warning(
            "augment = 'on' changes nothing on %s: it names no augmentation (its crop_padding is 0 and "
            "horizontal_flip off; a flip would change a digit's or letter's meaning); set the dataset's "
            "crop_padding or horizontal_flip options where it takes them",
            config.dataset,
        )
    return data


def check_sets(task: Task, info: Any, dataset: LoadedDataset, what: str) -> None:
    """The training and test sets are data the task can use (`Task.check`), else one DataError line."""
    for part, images in (("training set", dataset.train), ("test set", dataset.test)):
        try:
            task.check(info, images, f"{what} {part}")
        except ValueError as exc:
            raise DataError(str(exc)) from exc


def _load_sites(config: RunConfig, task: Task, server: Prepared) -> list[Prepared]:
    """Every site's own data, in-process (site_data.py), each checked as the server's are; two sites holding
    the same training records (one folder read twice), or a site the server's (data_dir names a site's
    folder), are mistakes named here."""
    sites: list[Prepared] = []
    seen: dict[str, int] = {}
    for k in range(config.clients):
        site = load_site(config, k, server.dataset.info)
        check_sets(task, site.dataset.info, site.dataset, f"site {k}'s")
        fingerprint = site.records_hash
        if fingerprint == server.records_hash:
            raise DataError(
                f"site {k} holds the server's training records (data_dir = {config.data_dir!r}), which would "
                "make them the server's validation and test data too; give the server a folder of its own"
            )
        if fingerprint in seen:
            raise DataError(
                f"sites {seen[fingerprint]} and {k} hold the same training records (site_data_dir = "
                f"{config.site_data_dir!r}); each site's folder must hold its own"
            )
        seen[fingerprint] = k
        sites.append(site)
    return sites


def client_contexts(
    config: RunConfig, algorithm: Algorithm, options: Any, data: Prepared, cache_dir: Path | None = None
) -> list[ClientContext]:
    """Each client's context: its train, validation and test shards, the shared test set and the options; a
    pooled algorithm gets one context holding all the training data. What every site shares (the test set,
    its facts and source names) is one object, not a copy per site: 1,000 sites must not hold 1,000 copies."""
    train, test, split, info = data.dataset.train, data.dataset.test, data.split, data.dataset.info
    sources = source_names(data.dataset)
    if algorithm.pooled:
        if data.sites is not None:
            everything = pooled(data.sites)
        else:
            everything = train.subset(np.sort(np.concatenate(split.client_train)))
        return [
            ClientContext(
                0,
                everything,
                train.subset(split.server_val),
                test,
                info,
                config,
                options,
                test,
                cache_dir,
                data.dataset.test_meta,
                sources,
            )
        ]
    if data.sites is not None:
        harness = data.dataset  # the server's test set scores what a site keeps
        return [
            site_context(config, options, site, k, cache_dir, harness) for k, site in enumerate(data.sites)
        ]
    return [
        client_context(config, options, data, k, cache_dir, sources) for k in range(len(split.client_train))
    ]


def site_context(
    config: RunConfig, options: Any, site: Prepared, k: int, cache_dir: Path | None, harness: LoadedDataset
) -> ClientContext:
    """Site `k`'s context from its own data (site_data.py): its one-site split, its own test part as its
    local test set, and the server's test set (`harness`) as the evaluation harness's."""
    return dataclasses.replace(
        client_context(config, options, site, 0, cache_dir),
        client_id=k,
        global_test=harness.test,
        global_test_meta=harness.test_meta,
        global_test_sources=source_names(harness),
    )


def client_context(
    config: RunConfig,
    options: Any,
    data: Prepared,
    k: int,
    cache_dir: Path | None = None,
    sources: list[str] | None = None,
) -> ClientContext:
    """Client `k`'s context alone (a node that hosts one site needs no other site's shards); `sources`:
    the test set's source names when the caller has them already (`source_names`)."""
    train, test, split = data.dataset.train, data.dataset.test, data.split
    return ClientContext(
        k,
        train.subset(split.client_train[k]),
        train.subset(split.client_val[k]),
        test.subset(split.client_test[k]),
        data.dataset.info,
        config,
        options,
        test,
        cache_dir,
        data.dataset.test_meta,
        source_names(data.dataset) if sources is None else sources,
    )
