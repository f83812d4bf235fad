"""MkDocs hooks (mkdocs.yml ``hooks:``) for the API reference (docs/api.md).

- mkdocstrings renders ``hologram`` and ``hologram_torch`` from their docstrings, but not
  the SDK ops: each is a ``hologram._native.FastOp`` (the native fast path wrapping a
  Python function), which griffe takes for a plain attribute and leaves out. Their section
  is written from the same docstrings, in ``hologram.ops.__all__``'s order, where the page
  says ``<!-- hologram.ops -->``.
- The docstrings name things with Sphinx roles (``:class:`Buffer```); Markdown keeps the
  role's name in front of the code span, which is dropped here."""

from __future__ import annotations

import inspect
import re

MARKER = "<!-- hologram.ops -->"


def _section() -> str:
    import hologram

    parts = []
    for name in hologram.ops.__all__:
        doc = inspect.getdoc(getattr(hologram.ops, name))
        if not doc:
            raise ValueError(f"hologram.ops.{name} has no docstring for the API reference")
        parts.append(f"### `hologram.ops.{name}`\n\n{doc}\n")
    return "\n".join(parts)


def on_page_markdown(markdown: str, page, **_) -> str:
    return markdown.replace(MARKER, _section()) if MARKER in markdown else markdown


_ROLE = re.compile(r":(?:class|func|mod|meth|attr|exc|data|obj):(?=<code>)")


def on_page_content(html: str, page, **_) -> str:
    return _ROLE.sub("", html) if page.file.src_uri == "api.md" else html
