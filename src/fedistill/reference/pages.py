"""Every generated reference page, by its path under docs/: what `docs/hooks.py` adds to the site at
build time (nothing of it is committed) and what `python -m fedistill.reference.pages OUT` writes out."""

from __future__ import annotations

import sys
from pathlib import Path

from fedistill.algorithms.registry import ALGORITHMS, algorithm_names
from fedistill.reference.cli_reference import cli_markdown
from fedistill.reference.config_keys import config_markdown
from fedistill.reference.markdown import table
from fedistill.reference.options import options_markdown
from fedistill.reference.protocol import messages_markdown
from fedistill.reference.python_api import api_markdown
from fedistill.reference.registries import (
    algorithms_markdown,
    datasets_markdown,
    models_markdown,
    partitioners_markdown,
    tasks_markdown,
)

INDEX = """# Reference

Every page of this section is generated from the code when the site is built, so it cannot drift from it:

| page | generated from |
|---|---|
| [Command line](cli.md) | the parser of `fedistill/cli.py` |
| [Config keys](config.md) | `fedistill.config.RunConfig` and its comments |
| [Algorithm options](options/index.md) | each algorithm's options dataclass and its field docs |
| [Algorithms](algorithms.md) | the algorithm registry |
| [Datasets](datasets.md) | the dataset registry, with the files each needs |
| [Models](models.md) | the model registry |
| [Partitioners](partitioners.md) | the partitioner registry |
| [Tasks](tasks.md) | the task registry |
| [Messages](messages.md) | the content kinds and each algorithm's client handlers |
| [Modules](modules.md) | the docstrings of the algorithms' modules |
| [Python API](api.md) | the docstrings and signatures of what a program calls or builds on |

In the terminal, `fedistill list` names everything registered and `fedistill list --options NAME` prints
one algorithm's options with their defaults.
"""


def options_index() -> str:
    """The page `reference/options/index.md`: one line per algorithm, linking its options."""
    rows = [(f"[`[{n}]`]({n}.md)", ALGORITHMS[n].summary) for n in algorithm_names()]
    return "\n".join(
        [
            "# Algorithm options",
            "",
            "Each algorithm reads a config table named after it (`[fediod]` in a config file, "
            "`--set fediod.w_adv=0.5` on the command line); unknown keys are refused with the valid ones.",
            "",
            table(("table", "algorithm"), rows),
            "",
        ]
    )


def modules_markdown() -> str:
    """The page `reference/modules.md`: every module of `fedistill.algorithms` by family, each shown by
    its docstring (mkdocstrings renders the `:::` blocks when the site is built)."""
    import fedistill.algorithms as package

    root = Path(package.__file__).parent
    parts = [
        "# Modules",
        "",
        "The docstring of every module under `fedistill.algorithms`, by family: where each paper's "
        "equations live in the code. The method pages map the equations to these modules.",
        "",
    ]
    for family in sorted(p for p in root.iterdir() if (p / "__init__.py").is_file()):
        parts += [f"## `{family.name}`", ""]
        for path in sorted(family.rglob("*.py")):
            dotted = ".".join(path.relative_to(root.parent.parent).with_suffix("").parts)
            dotted = dotted.removesuffix(".__init__")
            parts += [f"::: {dotted}", "    options:", "      heading_level: 3", ""]
    return "\n".join(parts)


def reference_pages() -> dict[str, str]:
    """Path under docs/ -> Markdown, for every generated reference page."""
    pages = {
        "reference/index.md": INDEX,
        "reference/cli.md": cli_markdown(),
        "reference/config.md": config_markdown(),
        "reference/algorithms.md": algorithms_markdown(),
        "reference/datasets.md": datasets_markdown(),
        "reference/models.md": models_markdown(),
        "reference/partitioners.md": partitioners_markdown(),
        "reference/tasks.md": tasks_markdown(),
        "reference/messages.md": messages_markdown(),
        "reference/modules.md": modules_markdown(),
        "reference/api.md": api_markdown(),
        "reference/options/index.md": options_index(),
    }
    pages |= {f"reference/options/{name}.md": options_markdown(name) for name in algorithm_names()}
    return pages


def write_pages(out: Path) -> list[Path]:
    """Write every reference page under `out` (the docs folder's layout); returns the paths written."""
    written = []
    for relative, text in reference_pages().items():
        path = out / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


if __name__ == "__main__":
    for path in write_pages(Path(sys.argv[1] if len(sys.argv) > 1 else "build/reference")):
        print(path)
