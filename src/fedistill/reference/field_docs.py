"""The one-line documentation of a dataclass field, read from its source: the string right after the
field (an attribute docstring), else the comment at the end of its line, else the comment lines right
above it. The first class in the MRO that declares the field with any of these wins, so a subclass that
only changes a default (`FedProxOptions.mu`) keeps its base class's text."""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import io
import re
import tokenize
from dataclasses import dataclass


@dataclass(frozen=True)
class FieldDoc:
    """One documented field: where it is declared and what its source says about it."""

    name: str
    owner: type  # the class whose source documents it (or declares it, when nothing does)
    text: str  # the whole doc, whitespace-normalised; "" when the source says nothing


def one_line(text: str) -> str:
    """The first sentence of `text` (whitespace-normalised), or all of it when it has one sentence."""
    text = " ".join(text.split())
    sentence = re.split(r"(?<!e[.]g)(?<!i[.]e)[.]\s+(?=[A-Z`(\"])", text, maxsplit=1)[0]
    return sentence if sentence.endswith(".") or sentence == text else sentence + "."


@functools.cache
def _class_docs(cls: type) -> dict[str, str]:
    """Field name -> doc text for the fields that `cls`'s own body declares (annotated assignments)."""
    try:
        lines, _ = inspect.getsourcelines(cls)
    except (OSError, TypeError):
        return {}
    source = inspect.cleandoc("\n" + "".join(lines)) if lines[0][:1].isspace() else "".join(lines)
    comments = _comments(source)
    tree = ast.parse(source)
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef))
    docs: dict[str, str] = {}
    body = node.body
    for index, item in enumerate(body):
        if not (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)):
            continue
        name = item.target.id
        following = body[index + 1] if index + 1 < len(body) else None
        if (
            isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            docs[name] = inspect.cleandoc(following.value.value)
            continue
        trailing = comments.get(item.end_lineno or item.lineno)
        if trailing and trailing[1]:
            docs[name] = trailing[0]
            continue
        above, line = [], item.lineno - 1
        while line in comments and not comments[line][1]:
            above.insert(0, comments[line][0])
            line -= 1
        docs[name] = " ".join(above)
    return docs


def _comments(source: str) -> dict[int, tuple[str, bool]]:
    """Line number -> (comment text, whether code precedes it on that line)."""
    found: dict[int, tuple[str, bool]] = {}
    code_lines: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            text = token.string.lstrip("#").strip()
            if text.startswith(("noqa", "type:", "fmt:")):
                continue
            found[token.start[0]] = (text, token.start[0] in code_lines)
        elif token.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
            code_lines.update(range(token.start[0], token.end[0] + 1))
    return found


def _annotations(cls: type) -> dict[str, object]:
    """The annotations `cls`'s own body declares (not its bases')."""
    return inspect.get_annotations(cls)


def field_docs(cls: type) -> list[FieldDoc]:
    """Every dataclass field of `cls`, in declaration order, with the doc its source gives it: from the
    first class in the MRO that declares the field with a doc, else from the base-most declaring class."""
    result = []
    for item in dataclasses.fields(cls):
        declaring = [base for base in cls.__mro__ if item.name in _annotations(base)]
        documented = [base for base in declaring if _class_docs(base).get(item.name)]
        if documented:
            result.append(FieldDoc(item.name, documented[0], _class_docs(documented[0])[item.name]))
        else:
            result.append(FieldDoc(item.name, declaring[-1] if declaring else cls, ""))
    return result
