"""Links from the Markdown pages to files of the repository, made to work on the site.

The pages under ``docs/`` are read in two places: on the repository's web view, where
``[base.py](../functrain/engine/protocol.py)`` opens the file, and on this site, whose
source directory is ``docs/`` alone. Before MyST parses a page (``source-read``), each
Markdown link that leaves ``docs/`` is rewritten for the site:

* ``../README.md`` -> the home page;
* ``../colabs/NAME.ipynb`` -> the rendered notebook ``notebooks/NAME``;
* any other file -> a download of that file (``{download}`` role);
* a directory -> the link's text alone (a site has no directory listing).

A link to something that does not exist is left alone, so the strict build reports it.
"""

from __future__ import annotations

import re
from pathlib import Path

LINK = re.compile(r"(?<!!)\[([^\]\n]+)\]\(([^)\s]+)\)")


def rewrite(text: str, page: Path, docs: Path) -> str:
    """Return the Markdown ``text`` of ``page`` with its out-of-docs links rewritten."""
    root = docs.parent

    def one(match: re.Match) -> str:
        label, target = match.group(1), match.group(2)
        if "://" in target or target.startswith(("#", "mailto:")):
            return match.group(0)
        path_part, _, anchor = target.partition("#")
        resolved = (page.parent / path_part).resolve()
        try:
            resolved.relative_to(docs)
            return match.group(0)  # a page of the site: MyST resolves it
        except ValueError:
            pass
        if not resolved.exists():
            return match.group(0)
        rel_to_docs = lambda p: Path(*([".."] * len(page.parent.relative_to(docs).parts)), p)
        if resolved == root / "README.md":
            return f"[{label}]({rel_to_docs('index.md').as_posix()})"
        if resolved.parent == root / "colabs" and resolved.suffix == ".ipynb":
            return f"[{label}]({rel_to_docs(Path('notebooks') / resolved.name).as_posix()})"
        if resolved.is_dir():
            return label
        plain = label.strip("`")
        return f"{{download}}`{plain} <{Path(path_part).as_posix()}>`"

    return LINK.sub(one, text)


def _on_source_read(app, docname: str, source: list[str]) -> None:
    page = Path(app.env.doc2path(docname))
    if page.suffix != ".md":
        return
    source[0] = rewrite(source[0], page, Path(app.srcdir))


def setup(app):
    app.connect("source-read", _on_source_read)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
