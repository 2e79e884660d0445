"""The papers' tables and figures, reproduced: which runs each needs (declared as `fedistill run`
settings), how it scores them and how it writes its Markdown and JSON. The benchmark scripts drive these
modules; the configs and expected values they read live in a source checkout (`paths`)."""
