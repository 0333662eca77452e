"""No test, demo, benchmark or build file reads outside the checkout.

``make test`` must pass in a fresh clone in an empty directory: a path that
climbs above the repository root (``../shared``, ``REPO_ROOT.parent``,
``Path(__file__).parents[k]`` past the root) or a hard-coded absolute path (such
as a developer's ``/tmp/venvtest``) works only on the machine that wrote it.
System locations of tools stay allowed (PostgreSQL's ``/usr/lib/postgresql/*/bin``,
``/usr/bin``, ``/bin/bash``, ``/dev/null``); temporary directories come from
``tempfile`` or pytest's ``tmp_path``, never from a literal.

A line that needs such a path as *data* (a hostile name in a test, say) says so
with the marker ``checkout-paths: data`` in a comment.
"""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]

#: The files the guard reads: tests, the demo and test harness, benchmarks, the build.
SCANNED_GLOBS = ("tests/**/*.py", "bench/**/*.py", "pgpoll/testing/**/*.py", "Makefile", ".ci/*", "pyproject.toml")
ALLOWED_ABSOLUTE = (
    re.compile(r"^/usr/lib/postgresql(/|$)"),
    re.compile(r"^/usr/(local/)?s?bin(/|$)"),
    re.compile(r"^/s?bin(/|$)"),
    re.compile(r"^/dev/(null|stdin|stdout|stderr)$"),
    re.compile(r"^/proc/"),
    re.compile(r"^/path/to/"),  # a placeholder in a message to the user
)
MARKER = "checkout-paths: data"
_ABSOLUTE = re.compile(r"(?<![\w.~$}/:])(/[A-Za-z0-9_.][A-Za-z0-9_.*+-]*(?:/[A-Za-z0-9_.*+-]+)*/?)")
_UP = re.compile(r"(?:^|[\s\"'=(:])((?:\.\./)+[^\s\"')]*)")
_ROOT_PARENT = re.compile(r"\b(?:REPO_ROOT|REPO|ROOT|repo_root)\s*\.\s*parent\b")
_PARENTS = re.compile(r"Path\(__file__\)(?:\.resolve\(\))?\.parents\[(\d+)\]")


def _strings(path: Path, text: str) -> list[tuple[int, str]]:
    """``(line, content)`` of every string literal (Python) or every line (other files)."""
    if path.suffix != ".py":
        return [(n, line.split("#", 1)[0]) for n, line in enumerate(text.splitlines(), 1)]
    out: list[tuple[int, str]] = []
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.STRING:
            out.append((tok.start[0], tok.string))
    return out


def _escapes(start: Path, relative: str) -> bool:
    target = (start / relative).resolve()
    return target != REPO_ROOT and REPO_ROOT not in target.parents


def find_escapes(path: Path, text: str) -> list[str]:
    """The places in ``text`` (the file at ``path``) that reach outside the checkout."""
    lines = text.splitlines()
    marked = {n for n, line in enumerate(lines, 1) if MARKER in line}
    found: list[str] = []
    rel = path.relative_to(REPO_ROOT) if REPO_ROOT in path.parents else path
    depth = len(rel.parts) - 1  # directories between the repository root and the file
    for n, line in enumerate(lines, 1):
        if n in marked:
            continue
        if _ROOT_PARENT.search(line):
            found.append(f"{rel}:{n}: the parent of the repository root: {line.strip()}")
        for m in _PARENTS.finditer(line):
            if int(m.group(1)) > depth:
                found.append(f"{rel}:{n}: Path(__file__).parents[{m.group(1)}] is above the repository root")
    for n, literal in _strings(path, text):
        if n in marked:
            continue
        for m in _UP.finditer(literal):
            up = m.group(1)
            if _escapes(REPO_ROOT, up) or (path.suffix == ".py" and _escapes(path.parent, up)):
                found.append(f"{rel}:{n}: relative path above the repository root: {up}")
        for m in _ABSOLUTE.finditer(literal):
            absolute = m.group(1)
            if absolute.count("/") < 2 and not absolute.endswith("/"):
                continue  # "/x" alone is a separator or an operator far more often than a path
            if not any(rule.search(absolute) for rule in ALLOWED_ABSOLUTE):
                found.append(f"{rel}:{n}: hard-coded absolute path: {absolute}")
    return found


def _scanned_files() -> list[Path]:
    files: set[Path] = set()
    for pattern in SCANNED_GLOBS:
        files.update(p for p in REPO_ROOT.glob(pattern) if p.is_file() and "golden" not in p.parts)
    files.discard(Path(__file__).resolve())  # its own examples are escapes on purpose
    return sorted(files)


def test_no_file_reads_outside_the_checkout() -> None:
    files = _scanned_files()
    assert any(p.name == "Makefile" for p in files) and len(files) > 50, "the guard found too few files to scan"
    problems = [problem for p in files for problem in find_escapes(p, p.read_text(encoding="utf-8"))]
    assert not problems, "paths outside the checkout:\n" + "\n".join(problems)


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("tests/decode/test_x.py", 'BASE = REPO_ROOT.parent / "shared"\n'),
        ("tests/decode/test_x.py", "ROOT = Path(__file__).resolve().parents[3]\n"),
        ("tests/decode/test_x.py", '_SITE = "/tmp/venvtest/lib/python3.11/site-packages"\n'),
        ("tests/decode/test_x.py", 'CORPUS = "../../../shared/corpus"\n'),
        ("Makefile", "test:\n\tPGPOLL_CORPUS=../shared/corpus pytest\n"),
        ("bench/x.py", 'OUT = "/home/me/results"\n'),
    ],
)
def test_the_guard_finds_each_kind_of_escape(name: str, text: str) -> None:
    assert find_escapes(REPO_ROOT / name, text)


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("tests/decode/test_x.py", 'BINDIRS = ["/usr/lib/postgresql/15/bin", "/usr/lib/postgresql/*/bin"]\n'),
        ("tests/decode/test_x.py", "REPO = Path(__file__).resolve().parents[2]\n"),
        ("tests/decode/test_x.py", 'GOLDEN = Path(__file__).parent / "golden"\n'),
        ("tests/sink/test_x.py", f'NAMES = ["../../etc/passwd"]  # {MARKER}: a hostile table name\n'),
        ("Makefile", "SHELL := /bin/bash\nrun:\n\tfoo > /dev/null\n"),
        ("tests/x.py", 'ratio = "a/b"\n'),
    ],
)
def test_the_guard_allows_tools_and_paths_inside(name: str, text: str) -> None:
    assert find_escapes(REPO_ROOT / name, text) == []
