"""The page `reference/api.md`: the Python API and the extension points the guides build on, each name shown
with its signature and docstring (mkdocstrings renders the `:::` blocks when the site is built).

The names are listed here, not discovered: a page of every public function of every module would bury the
few a user calls under the run loop's internals. `tests/test_docs.py` holds the list to `fedistill.__all__`.
"""

from __future__ import annotations

#: (section title, what it is for, [(dotted name, whether its documented public members are shown)])
SECTIONS: tuple[tuple[str, str, tuple[tuple[str, bool], ...]], ...] = (
    (
        "Running and reading runs",
        "`import fedistill` gives `run`, `summary`, `load_model`, `export`, `RunResult` and `TrainedModel` "
        "(imported on first use, so `import fedistill` stays light); see "
        "[Use a trained model](../how-to/use-a-trained-model.md).",
        (
            ("fedistill.api.run", False),
            ("fedistill.api.summary", False),
            ("fedistill.inference.loading.load_model", False),
            ("fedistill.inference.export.export", False),
            ("fedistill.inference.results.RunResult", True),
            ("fedistill.inference.results.AlgorithmResult", True),
            ("fedistill.inference.trained_model.TrainedModel", True),
        ),
    ),
    (
        "Writing an algorithm",
        "Client logic, server logic and the messages between them; see "
        "[Write an algorithm](../how-to/write-algorithm.md) and "
        "[the message boundary](../concepts/message-boundary.md).",
        (
            ("fedistill.federation.messages.Message", True),
            ("fedistill.federation.messages.ArraySpec", True),
            ("fedistill.federation.messages.expect_arrays", False),
            ("fedistill.federation.messages.state_specs", False),
            ("fedistill.federation.client.ClientLogic", True),
            ("fedistill.federation.client.handles", False),
            ("fedistill.federation.fleet.Fleet", True),
            ("fedistill.federation.fleet.Reply", True),
            ("fedistill.federation.fleet.successful", False),
            ("fedistill.federation.reply_spec.ReplySpec", True),
            ("fedistill.algorithms.base.Algorithm", False),
            ("fedistill.algorithms.base.ClientContext", False),
            ("fedistill.algorithms.base.ServerContext", False),
            ("fedistill.algorithms.base.ServerLogic", True),
            ("fedistill.algorithms.base.StopRun", False),
            ("fedistill.algorithms.base.register", False),
            ("fedistill.algorithms.shared.training.LocalTraining", False),
            ("fedistill.algorithms.shared.training.new_model", False),
            ("fedistill.algorithms.shared.training.train_local", False),
            ("fedistill.algorithms.shared.training.evaluate_model", False),
            ("fedistill.algorithms.shared.training.test_metrics", False),
        ),
    ),
    (
        "Tasks, models, datasets and partitioners",
        "See [Write a task or a dataset](../how-to/write-task-or-dataset.md).",
        (
            ("fedistill.tasks.base.Task", True),
            ("fedistill.tasks.make_task", False),
            ("fedistill.models.registry.register_model", False),
            ("fedistill.models.registry.build_model", False),
            ("fedistill.data.catalog.DatasetEntry", False),
            ("fedistill.data.partition.registry.register", False),
        ),
    ),
    (
        "Errors",
        "A user's mistake raises a `UserError` with a one-line message; a failure across the message "
        "boundary a `FederationError`.",
        (
            ("fedistill.errors.UserError", False),
            ("fedistill.errors.ConfigError", False),
            ("fedistill.errors.DataError", False),
            ("fedistill.errors.PartitionError", False),
            ("fedistill.errors.RunDirError", False),
            ("fedistill.errors.FederationError", False),
        ),
    ),
)


def api_markdown() -> str:
    """The page, one `:::` block per name under its section."""
    parts = [
        "# Python API",
        "",
        "The functions and classes a program calls or builds on, with their signatures and docstrings.",
        "",
    ]
    for title, about, names in SECTIONS:
        parts += [f"## {title}", "", about, ""]
        for dotted, members in names:
            parts += [f"::: {dotted}", "    options:", "      heading_level: 3"]
            if members:  # null: the documented public members, through the filter (true would list dunders)
                parts += ["      members: null", '      filters: ["!^_"]']
            parts += ["      show_root_full_path: false", ""]
    return "\n".join(parts)
