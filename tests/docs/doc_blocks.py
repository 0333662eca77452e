"""The code blocks of a documentation page, with the test marker written above each.

A page that the tests run marks every command block with an HTML comment (invisible on the site) on the
line before its fence:

* ``<!-- test: run -->``: the test runs the block (``sh`` in one bash session per page set, ``python``
  with the venv's interpreter), in page order, and fails when it fails;
* ``<!-- test: skip REASON -->``: not run, and the reason says why (the install step, a crontab line);
* ``<!-- test: covered by PATH ... -->``: not run here because the test at PATH runs it (the path must exist);

and, standing alone, ``<!-- test: app-sql STATEMENTS -->``: SQL the test runs at that point as the
application would (writes between two steps), invisible to the reader.

Blocks in ``text``, ``json`` and ``mermaid`` are output or pictures, not commands, and need no marker.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

COMMAND_LANGUAGES = {"sh", "bash", "shell", "console", "python", "py", ""}
OUTPUT_LANGUAGES = {"text", "json", "mermaid", "yaml", "sql", "ini", "toml"}
_FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>```+|~~~+)\s*(?P<lang>[\w+-]*)")
_MARKER = re.compile(r"^\s*<!--\s*test:\s*(?P<kind>run|skip|covered by|app-sql)\b\s*(?P<rest>.*?)\s*-->\s*$", re.S)


@dataclass(frozen=True)
class Block:
    """A fenced code block (or an ``app-sql`` marker, with ``language`` ``app-sql`` and the SQL as ``code``)."""

    page: Path
    line: int
    language: str
    code: str
    marker: str | None  # run, skip, covered by, app-sql; None when the block has no marker
    note: str = ""

    def where(self) -> str:
        return f"{self.page.name}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """Every fenced block and ``app-sql`` marker of ``page``, in order."""
    lines = page.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    pending: tuple[str, str] | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        marker = _MARKER.match(line)
        if marker:
            kind, rest = marker.group("kind"), marker.group("rest")
            if kind == "app-sql":
                found.append(Block(page, i + 1, "app-sql", rest, "app-sql"))
            else:
                pending = (kind, rest)
            i += 1
            continue
        fence = _FENCE.match(line)
        if fence:
            close = fence.group("fence")
            start = i
            body: list[str] = []
            i += 1
            while i < len(lines) and not lines[i].strip().startswith(close):
                body.append(lines[i])
                i += 1
            kind, note = pending if pending else (None, "")
            found.append(Block(page, start + 1, fence.group("lang").lower(), "\n".join(body), kind, note))
            pending = None
            i += 1
            continue
        if line.strip():
            pending = None  # a marker belongs to the block right below it
        i += 1
    return found


def unmarked(found: list[Block]) -> list[Block]:
    """Command blocks without a marker: each must be run, skipped with a reason, or covered elsewhere."""
    return [b for b in found if b.language in COMMAND_LANGUAGES and b.marker is None]
