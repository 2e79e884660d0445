"""MkDocs hook: adds the reference pages generated from the code (`fedistill.reference.pages`) to the
site at build time. They are never written into docs/, so they cannot go stale in the repository."""

from __future__ import annotations

import logging

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

log = logging.getLogger("mkdocs.hooks.fedistill")


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """Add every generated reference page; a page of the same path in docs/ would be a mistake."""
    from fedistill.reference.pages import reference_pages

    for path, text in reference_pages().items():
        if files.get_file_from_path(path) is not None:
            raise ValueError(f"docs/{path} is generated at build time; delete the file in docs/")
        files.append(File.generated(config, path, content=text))
    log.info("fedistill: %d reference pages generated from the code", len(reference_pages()))
    from fedistill.reference.results import figure_files

    for path, source in figure_files().items():  # the results pages' figures, straight from the results
        files.append(File.generated(config, path, abs_src_path=str(source)))
    return files
