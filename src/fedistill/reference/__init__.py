"""Documentation generated from the code: the command line, every config key, the registries and the
published results, as Markdown for the documentation site (`docs/hooks.py`) and text for the terminal.

Nothing here is written twice: each page reads the parser, the dataclasses' field comments and
docstrings, and the registries, so a key without a one-line doc is a failing test (tests/test_docs.py).
The package sits on top, beside cli.py: it imports the command line's parser and every registry.
"""
