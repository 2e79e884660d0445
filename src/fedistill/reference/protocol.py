"""The protocol's vocabulary, read from the code: the content kinds a message may carry (with the
comment beside each in `federation/messages.py`) and the message types each algorithm's client handles
(its `@handles` methods)."""

from __future__ import annotations

import ast
import inspect
import io
import tokenize

from fedistill.algorithms.registry import ALGORITHMS, algorithm_names
from fedistill.federation import messages
from fedistill.federation.messages import ALLOWED_DTYPES, CONTENT_KINDS
from fedistill.reference.markdown import table


def content_kinds() -> dict[str, str]:
    """Content kind -> the comment beside it in `CONTENT_KINDS`, in the source's order."""
    source = inspect.getsource(messages)
    comments = {
        token.start[0]: token.string.lstrip("#").strip()
        for token in tokenize.generate_tokens(io.StringIO(source).readline)
        if token.type == tokenize.COMMENT
    }
    found: dict[str, str] = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and node.value in CONTENT_KINDS and node.value not in found:
            found[node.value] = comments.get(node.lineno, "")
    return found


def handled_types(name: str) -> list[str]:
    """The message types algorithm `name`'s client logic answers, sorted."""
    return sorted(getattr(ALGORITHMS[name].client, "_handlers", {}))


def messages_markdown() -> str:
    """The page `reference/messages.md`."""
    kinds = [(f"`{kind}`", doc) for kind, doc in content_kinds().items()]
    handled = [(f"`{n}`", ", ".join(f"`{t}`" for t in handled_types(n))) for n in algorithm_names()]
    return "\n".join(
        [
            "# Messages",
            "",
            "Generated from `fedistill.federation.messages` and the algorithms' client logic. A message "
            "is a type (`train`, `evaluate` or `query`, optionally `.name`) with arrays and scalars "
            "grouped by content kind; see [the message boundary](../concepts/message-boundary.md).",
            "",
            "## Content kinds",
            "",
            table(("kind", "what it carries"), kinds),
            "",
            "Array dtypes allowed on the wire: " + ", ".join(f"`{d}`" for d in sorted(ALLOWED_DTYPES)) + ".",
            "",
            "## The messages each algorithm's clients answer",
            "",
            "What a method's clients send back, kind by kind, is in every run's ledger and summary; the "
            "method pages say what each message carries.",
            "",
            table(("algorithm", "message types its clients handle"), handled),
            "",
        ]
    )
