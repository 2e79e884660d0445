"""What each registry holds, by name: algorithms (summary, tasks), datasets (the files each needs,
`data.registry.describe_files`), models, partitioners and tasks, each with the line that documents it."""

from __future__ import annotations

import dataclasses
import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass

from fedistill.algorithms.registry import ALGORITHMS, algorithm_names
from fedistill.data.catalog import ALIASES, DATASETS
from fedistill.data.partition import PARTITIONERS
from fedistill.data.registry import dataset_names, describe_files
from fedistill.models.registry import _MODELS, model_names
from fedistill.reference.field_docs import field_docs, one_line
from fedistill.reference.markdown import prose, table
from fedistill.tasks import TASKS


@dataclass(frozen=True)
class Entry:
    """One registered name and the one line that says what it is."""

    name: str
    doc: str
    options: tuple[str, ...] = ()


def _first_sentence(obj: object) -> str:
    doc = inspect.getdoc(obj) or ""
    return one_line(doc) if doc else ""


def _task_doc(task: type) -> str:
    """A task class's own docstring, else its module's (dataclasses write a signature in its place)."""
    own = task.__dict__.get("__doc__") or ""
    if own and not own.startswith(f"{task.__name__}("):
        return one_line(inspect.cleandoc(own))
    return _first_sentence(sys.modules[task.__module__])


def _partitioner_options(function: Callable) -> tuple[str, ...]:
    common = {"labels", "num_clients", "alpha", "seed", "num_classes"}
    wrapped = getattr(function, "__wrapped__", function)
    return tuple(p for p in inspect.signature(wrapped).parameters if p not in common)


def entries() -> dict[str, list[Entry]]:
    """Registry name -> its entries, in the order `fedistill list` prints them."""
    return {
        "algorithms": [Entry(n, ALGORITHMS[n].summary) for n in algorithm_names()],
        "datasets": [Entry(n, describe_files(n), DATASETS[n].options) for n in dataset_names()],
        "models": [Entry(n, _first_sentence(_MODELS[n].factory), _MODELS[n].options) for n in model_names()],
        "partitioners": [
            Entry(n, _first_sentence(fn), _partitioner_options(fn)) for n, fn in sorted(PARTITIONERS.items())
        ],
        "tasks": [
            Entry(n, _task_doc(t), tuple(f.name for f in dataclasses.fields(t))) for n, t in TASKS.items()
        ],
    }


def _options(entry: Entry) -> str:
    return ", ".join(f"`{o}`" for o in entry.options)


def _page(title: str, intro: str, body: list[str]) -> str:
    return "\n".join([f"# {title}", "", intro, "", *body, ""])


def algorithms_markdown() -> str:
    """The page `reference/algorithms.md`."""
    rows = [
        (f"`{e.name}`", e.doc, ", ".join(ALGORITHMS[e.name].tasks), f"[`[{e.name}]`](options/{e.name}.md)")
        for e in entries()["algorithms"]
    ]
    intro = (
        "Generated from the algorithm registry (`fedistill.algorithms.registry`): each name, its summary, "
        "the tasks it runs on and its options table."
    )
    return _page("Algorithms", intro, [table(("name", "what it is", "tasks", "options"), rows)])


def datasets_markdown() -> str:
    """The page `reference/datasets.md`: every dataset with its options and the files it needs."""
    body = []
    for entry in entries()["datasets"]:
        body += [f"## `{entry.name}`", ""]
        aliases = [alias for alias, name in ALIASES.items() if name == entry.name]
        if aliases:
            spelt = ", ".join(f"`{alias}`" for alias in aliases)
            body += [
                f"Also spelt {spelt}, in `dataset` and as its table's name: one dataset, one table "
                f"(two spellings of its table in one config are refused).",
                "",
            ]
        if entry.options:
            body += [f"Options (table `[{entry.name}]`): {_options(entry)}.", ""]
        body += ["```text", entry.doc, "```", ""]
    intro = (
        "Generated from the dataset registry (`fedistill.data.registry`): what each dataset needs under "
        "`--data-dir`, as `fedistill run` says it when a file is missing. A dataset's options are a table "
        "named after it (`[cifar100]`, `--set cifar100.labels=coarse`). More on the data: "
        "[datasets and partitions](../concepts/data.md)."
    )
    return _page("Datasets", intro, body)


def models_markdown() -> str:
    """The page `reference/models.md`."""
    rows = []
    for entry in entries()["models"]:
        spec = _MODELS[entry.name]
        norms = ", ".join(dict.fromkeys((spec.default_norm, *spec.norms)))
        rows.append((f"`{entry.name}`", entry.doc, ", ".join(spec.tasks), norms, _options(entry)))
    intro = (
        "Generated from the model registry (`fedistill.models.registry`). `norm` picks among a model's "
        "norms (its default first); options go in `[model_options]`, and every model the run builds must "
        "take them. More: [models](../concepts/models.md)."
    )
    return _page("Models", intro, [table(("name", "what it is", "tasks", "norms", "options"), rows)])


def partitioners_markdown() -> str:
    """The page `reference/partitioners.md`."""
    rows = [(f"`{e.name}`", e.doc, _options(e)) for e in entries()["partitioners"]]
    intro = (
        "Generated from `fedistill.data.partition.PARTITIONERS`; `partition` names one, its options go in "
        "`[partition_options]`. More: [datasets and partitions](../concepts/data.md)."
    )
    return _page("Partitioners", intro, [table(("name", "what it does", "options"), rows)])


def tasks_markdown() -> str:
    """The page `reference/tasks.md`."""
    body = []
    for entry in entries()["tasks"]:
        task = TASKS[entry.name]
        body += [f"## `{entry.name}`", "", prose(entry.doc), ""]
        body += [f"Target: {task.target}. Headline metric: `test_{task.headline}`.", ""]
        if entry.options:
            defaults = {f.name: f.default for f in dataclasses.fields(task)}
            rows = [(f"`{d.name}`", f"`{defaults[d.name]!r}`", d.text) for d in field_docs(task)]
            body += [table(("option", "default", "meaning"), rows), ""]
    intro = (
        "Generated from `fedistill.tasks.TASKS`. A dataset names its task; the task's options go in "
        "`[task]`. More: [tasks](../concepts/tasks.md)."
    )
    return _page("Tasks", intro, body)
