"""The documentation's Python examples run and their assertions hold (every ```python
block of docs/*.md; fragments that cannot run alone are marked ```py instead)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"
_BLOCK = re.compile(r"```python\n(.*?)```", re.S)


def _examples():
    for page in sorted(DOCS.glob("*.md")):
        for i, code in enumerate(_BLOCK.findall(page.read_text())):
            yield pytest.param(code, id=f"{page.stem}-{i}")


@pytest.mark.parametrize("code", list(_examples()))
def test_example_runs(code):
    exec(compile(code, "<docs example>", "exec"), {"__name__": "__docs__"})
