"""MkDocs hooks of the documentation site (mkdocs.yml: ``hooks``).

pgpoll's docstrings name other objects with Sphinx roles (``:func:`read_changes```); mkdocstrings renders
the role's name as text in front of the code span. The role adds nothing on a page, so it is dropped.
"""

from __future__ import annotations

import re
from typing import Any

_ROLE = re.compile(r":(?:func|class|meth|mod|attr|data|exc|obj):(?=<code)")


def on_page_content(html: str, **_: Any) -> str:
    """The page's HTML without Sphinx role prefixes before code spans."""
    return _ROLE.sub("", html)
