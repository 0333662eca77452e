"""The import rules of pgpoll's layering, read from the source with :mod:`ast` (no import runs).

The README promises a layering: pure decoders, type mapping and row filters that know nothing of I/O;
database drivers only where pgpoll talks to the server (and in the test helpers that set one up); click
only in the CLI; no import cycle. Nothing in Python enforces that, so this test does:

* ``pgpoll.decode``, ``pgpoll.typed`` and ``pgpoll.rowfilter`` import nothing of pgpoll but
  ``pgpoll.changes``, ``pgpoll.lsn``, ``pgpoll.errors`` and their own package, and none of the I/O
  libraries (pyspark, py4j, drivers, click, tenacity); pyarrow and the standard library are fine;
* database drivers and SQLAlchemy only in ``pgpoll/source/`` and ``pgpoll/testing/``;
* click only in ``pgpoll/cli/``;
* Airflow only in ``pgpoll/airflow/``, which imports nothing but Airflow, the standard library and its
  own package, and so does the package root ``pgpoll/__init__.py`` that loads it: pgpoll is installed in
  Airflow's environment without its dependencies, for the DAG file's operators;
* the jobs' packages (``pgpoll.ingest``, ``pgpoll.snapshot``, ``pgpoll.materialize``, ``pgpoll.spark``,
  ``pgpoll.housekeeping``) do not
  import one another, but for the exceptions named in ``JOB_EXCEPTIONS`` (the Spark plumbing every job
  runs on, the ingest task the Spark stream runs, the Delta protocol features the Spark reader checks);
* no module over ``MAX_LINES`` lines and no folder of ``pgpoll/`` holding more than ``MAX_MODULES``
  modules directly (``__init__.py`` and the compatibility aliases of moved modules not counted): a larger
  one is two things, or a folder that wants sub-packages;
* no cycle among pgpoll's modules. Every import counts: those inside functions (they still tie the
  modules together; they only hide the cycle until one runs) and those under ``if TYPE_CHECKING:``
  (they never run, but the two modules still cannot be understood, moved or tested one without the
  other; a type both need goes to a module both import, e.g. a ``Protocol`` of what one needs of the
  other). The other rules count every import too: a type named from a layer is still a dependency on it.

Every rule is also run on a small synthetic tree, so a checker that can no longer fail is noticed.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

PURE_PACKAGES = ("pgpoll.decode", "pgpoll.typed", "pgpoll.rowfilter")
PURE_MAY_IMPORT = ("pgpoll.changes", "pgpoll.lsn", "pgpoll.errors")
# What a pure package must not import even though it is not pgpoll's: the I/O and framework layers.
PURE_FORBIDDEN = (
    "pyspark", "py4j", "click", "tenacity", "sqlalchemy",
    "psycopg2", "psycopg", "psycopg_pool", "adbc_driver_postgresql", "adbc_driver_manager",
)
# Database access: drivers (today psycopg2; the others named so a later switch stays inside the rule).
DRIVERS = ("psycopg2", "psycopg", "psycopg_pool", "adbc_driver_postgresql", "adbc_driver_manager", "sqlalchemy")
DRIVER_PACKAGES = ("pgpoll.source", "pgpoll.testing")
CLICK_PACKAGES = ("pgpoll.cli",)
# Imported in Airflow's environment, where pgpoll is installed without its dependencies: the package and the root.
AIRFLOW_PACKAGE = "pgpoll.airflow"
AIRFLOW_MAY_IMPORT = ("airflow", "pgpoll.airflow")
# The jobs: each is its own package and none reaches into another's modules, but for these (importer -> target,
# prefixes): every job runs on the Spark plumbing; the Spark stream runs ingest's batch task and checks the change
# table's Delta protocol with the features the Delta state's edge reads.
JOB_PACKAGES = ("pgpoll.ingest", "pgpoll.snapshot", "pgpoll.materialize", "pgpoll.spark", "pgpoll.housekeeping")
JOB_EXCEPTIONS = (
    ("pgpoll", "pgpoll.spark.session"),
    ("pgpoll", "pgpoll.spark.filesystems"),
    ("pgpoll", "pgpoll.spark.arrow_files"),
    ("pgpoll.spark", "pgpoll.ingest.task"),
    ("pgpoll.spark", "pgpoll.materialize.delta.table"),
)
MAX_LINES = 450
MAX_MODULES = 20


@dataclass(frozen=True)
class Import:
    """One imported module name as written (resolved to absolute), where, and whether it is typing-only."""

    importer: str
    target: str
    path: Path
    line: int
    type_checking: bool

    def where(self) -> str:
        return f"{self.path}:{self.line}"


def _within(name: str, packages: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


def module_names(root: Path) -> dict[str, Path]:
    """Every module of the ``pgpoll`` package under ``root``, by dotted name (a package by its own name)."""
    found: dict[str, Path] = {}
    for path in sorted((root / "pgpoll").rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _walk(nodes: list[ast.stmt], type_checking: bool) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import statement, at any depth (functions, classes, try blocks), with its TYPE_CHECKING flag."""
    for node in nodes:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node, type_checking
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            yield from _walk(node.body, True)
            yield from _walk(node.orelse, type_checking)
        else:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.stmt):
                    yield from _walk([child], type_checking)
                elif isinstance(child, ast.ExceptHandler | ast.match_case):
                    yield from _walk(child.body, type_checking)


def imports_of(module: str, path: Path, modules: dict[str, Path], root: Path) -> list[Import]:
    """The modules ``module`` imports: a ``from X import name`` names ``X.name`` when that is a module, else ``X``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node, type_checking in _walk(tree.body, False):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            if node.level:
                base_parts = package.split(".")
                base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            targets = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names
            ]
        for target in dict.fromkeys(targets):
            found.append(Import(module, target, path.relative_to(root), node.lineno, type_checking))
    return found


def all_imports(root: Path) -> list[Import]:
    modules = module_names(root)
    return [imp for name, path in modules.items() for imp in imports_of(name, path, modules, root)]


def _layer_problem(imp: Import) -> str | None:
    """What rule (other than cycles) one import breaks, if any; the most specific one."""
    top = imp.target.split(".")[0]
    pure = next((p for p in PURE_PACKAGES if _within(imp.importer, (p,))), None)
    if pure is not None:
        if top == "pgpoll" and not _within(imp.target, (pure, *PURE_MAY_IMPORT)):
            return f"{pure} may import only its own package and {', '.join(PURE_MAY_IMPORT)}"
        if top in PURE_FORBIDDEN:
            return f"{pure} must stay free of I/O"
    if top in DRIVERS and not _within(imp.importer, DRIVER_PACKAGES):
        return f"it is a database library; only {' and '.join(DRIVER_PACKAGES)} may import one"
    if top == "click" and not _within(imp.importer, CLICK_PACKAGES):
        return "only pgpoll.cli may import click"
    if imp.importer == "pgpoll" or _within(imp.importer, (AIRFLOW_PACKAGE,)):
        if top not in sys.stdlib_module_names and not _within(imp.target, AIRFLOW_MAY_IMPORT):
            return "pgpoll.airflow (and the package root) may import only Airflow, the standard library and itself"
    elif top == "airflow":
        return "only pgpoll.airflow may import airflow"
    job = next((p for p in JOB_PACKAGES if _within(imp.importer, (p,))), None)
    other = next((p for p in JOB_PACKAGES if _within(imp.target, (p,))), None)
    if job and other and job != other and not any(
        _within(imp.importer, (importer,)) and _within(imp.target, (target,)) for importer, target in JOB_EXCEPTIONS
    ):
        return f"{job} may not import another job's package ({other}); move what both need out of the jobs"
    return None


def layer_violations(imports: list[Import]) -> list[str]:
    """Broken rules other than cycles, one line per import."""
    return [
        f"{imp.where()}: {imp.importer} imports {imp.target}; {problem}"
        for imp in imports
        if (problem := _layer_problem(imp)) is not None
    ]


def _nearest_module(target: str, modules: set[str]) -> str | None:
    while target and target not in modules:
        target = target.rpartition(".")[0]
    return target or None


def cycles(imports: list[Import], modules: set[str]) -> list[list[Import]]:
    """Import cycles among ``modules`` (``TYPE_CHECKING`` imports included), one shortest cycle per tangle."""
    edges: dict[str, dict[str, Import]] = {m: {} for m in modules}
    for imp in imports:
        target = _nearest_module(imp.target, modules)
        if target is not None and imp.importer in modules:
            edges[imp.importer].setdefault(target, imp)

    # Tarjan's strongly connected components, iteratively (no recursion limit on a big tree).
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    counter = 0
    for start in sorted(modules):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    components.append(component)
            elif child not in index:
                index[child] = low[child] = counter
                counter += 1
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(edges[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])

    found = []
    for component in components:
        members = set(component)
        first = min(component)
        if len(component) == 1 and first not in edges[first]:
            continue
        # Shortest path back to `first` inside the component (breadth first), as the import statements.
        paths: dict[str, list[Import]] = {first: []}
        queue = [first]
        cycle: list[Import] | None = None
        while queue and cycle is None:
            node = queue.pop(0)
            for child, imp in sorted(edges[node].items()):
                if child == first:
                    cycle = [*paths[node], imp]
                    break
                if child in members and child not in paths:
                    paths[child] = [*paths[node], imp]
                    queue.append(child)
        assert cycle is not None
        found.append(cycle)
    return found


def cycle_violations(root: Path) -> list[str]:
    modules = module_names(root)
    imports = all_imports(root)
    return [
        "import cycle: " + " -> ".join(imp.importer for imp in cycle) + f" -> {cycle[0].importer} ("
        + ", ".join(f"{imp.where()} imports {imp.target}" + (" under TYPE_CHECKING" if imp.type_checking else "")
                    for imp in cycle) + ")"
        for cycle in cycles(imports, set(modules))
    ]


def _is_alias(path: Path) -> bool:
    """A moved module's old name kept for compatibility (``sys.modules[__name__] = _moved``): not a module of its own."""
    return "sys.modules[__name__] = _moved" in path.read_text(encoding="utf-8")


def size_violations(root: Path) -> list[str]:
    problems = []
    folders: dict[Path, int] = {}
    for path in sorted((root / "pgpoll").rglob("*.py")):
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > MAX_LINES:
            problems.append(f"{path.relative_to(root)}: {lines} lines, over {MAX_LINES}: it is two things, split it")
        if path.name != "__init__.py" and not _is_alias(path):
            folders[path.parent] = folders.get(path.parent, 0) + 1
    problems += [
        f"{folder.relative_to(root)}/: {count} modules, over {MAX_MODULES}: group them in sub-packages"
        for folder, count in sorted(folders.items()) if count > MAX_MODULES
    ]
    return problems


def violations(root: Path) -> list[str]:
    return layer_violations(all_imports(root)) + cycle_violations(root) + size_violations(root)


# --- the rules on pgpoll itself ------------------------------------------------------------------------------------


def test_pgpoll_keeps_its_layering() -> None:
    problems = violations(ROOT)
    assert not problems, "pgpoll's import rules are broken:\n" + "\n".join(problems)


def test_the_checker_sees_pgpoll() -> None:
    modules = module_names(ROOT)
    assert {"pgpoll.decode.wire", "pgpoll.errors", "pgpoll.cli", "pgpoll.airflow.operators"} <= set(modules)
    assert any(imp.target == "pgpoll.errors" for imp in all_imports(ROOT))


# --- the checker on synthetic trees: each rule can fail --------------------------------------------------------------


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in {"pgpoll/__init__.py": "", **files}.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        for parent in path.relative_to(tmp_path).parents:
            init = tmp_path / parent / "__init__.py"
            if parent.parts and not init.exists():
                init.write_text("")
        path.write_text(text)
    return tmp_path


def test_a_clean_tree_passes(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "pgpoll/errors.py": "",
        "pgpoll/lsn.py": "from pgpoll.errors import X\n",
        "pgpoll/decode/wire.py": "import struct\nimport pyarrow as pa\nfrom pgpoll import errors, lsn\n",
        "pgpoll/decode/text.py": "from . import wire\nfrom .wire import Reader\n",
        "pgpoll/source/conn.py": "import psycopg2\nfrom pgpoll.decode import wire\n",
        "pgpoll/cli/main.py": "import click\nfrom pgpoll.source import conn\n",
        # a type both need, in a module both import: no cycle
        "pgpoll/sink/host.py": "from typing import Protocol\nclass Host(Protocol):\n    name: str\n",
        "pgpoll/sink/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pgpoll.sink.host import Host\n",
        "pgpoll/sink/b.py": "from pgpoll.sink import a\nfrom pgpoll.sink.host import Host\n",
        "pgpoll/airflow/__init__.py": '"""Operators."""\n',
        "pgpoll/airflow/ops.py": "import json\nfrom airflow.sdk import DAG\nfrom pgpoll.airflow import hooks\n",
        "pgpoll/airflow/hooks.py": "from __future__ import annotations\nfrom typing import Any\n",
    })
    assert violations(root) == []


@pytest.mark.parametrize(("module", "text", "expected"), [
    ("pgpoll/decode/x.py", "from pgpoll.sink import writer\n", "pgpoll.decode may import only"),
    ("pgpoll/typed/x.py", "import pgpoll.source.conn\n", "pgpoll.typed may import only"),
    ("pgpoll/rowfilter/x.py", "from ..sink import writer\n", "pgpoll.rowfilter may import only"),
    ("pgpoll/decode/x.py", "def f():\n    import pyspark.sql\n", "must stay free of I/O"),
    ("pgpoll/typed/x.py", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pyspark\n",
     "must stay free of I/O"),
    ("pgpoll/rowfilter/x.py", "import psycopg2\n", "must stay free of I/O"),
    ("pgpoll/sink/x.py", "import psycopg2.extras\n", "imports psycopg2.extras; it is a database library"),
    ("pgpoll/ingest/x.py", "try:\n    import psycopg\nexcept ImportError:\n    pass\n", "psycopg; it is a database library"),
    ("pgpoll/ingest/x.py", "from adbc_driver_postgresql import dbapi\n", "adbc_driver_postgresql; it is a database"),
    ("pgpoll/reader.py", "import adbc_driver_manager\n", "adbc_driver_manager; it is a database library"),
    ("pgpoll/sink/x.py", "import click\n", "only pgpoll.cli may import click"),
    ("pgpoll/source/x.py", "class C:\n    def f(self):\n        from click import echo\n", "only pgpoll.cli may"),
    ("pgpoll/sink/x.py", "from airflow.sdk import DAG\n", "only pgpoll.airflow may import airflow"),
    ("pgpoll/airflow/x.py", "from pgpoll.sink import writer\n", "pgpoll.airflow (and the package root) may import only"),
    ("pgpoll/airflow/x.py", "def f():\n    import pyarrow\n", "pgpoll.airflow (and the package root) may import only"),
    ("pgpoll/__init__.py", "from pgpoll.source import conn\n", "pgpoll.airflow (and the package root) may import only"),
    ("pgpoll/materialize/x.py", "from pgpoll.ingest import batch\n", "pgpoll.materialize may not import another job's"),
    ("pgpoll/snapshot/x.py", "def f():\n    from pgpoll.materialize.state import S\n", "may not import another job's"),
    ("pgpoll/spark/x.py", "from pgpoll.ingest.run import r\n", "pgpoll.spark may not import another job's package"),
])
def test_each_layer_rule_can_fail(tmp_path: Path, module: str, text: str, expected: str) -> None:
    root = _tree(tmp_path, {"pgpoll/sink/writer.py": "", "pgpoll/source/conn.py": "", module: text})
    problems = violations(root)
    assert len(problems) == 1 and expected in problems[0], problems
    assert problems[0].startswith(module + ":")


def test_the_jobs_exceptions_pass(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "pgpoll/spark/session.py": "", "pgpoll/ingest/task.py": "",
        "pgpoll/materialize/run.py": "from pgpoll.spark.session import get\n",
        "pgpoll/spark/reads.py": "from pgpoll.ingest.task import run\n",
    })
    assert violations(root) == []


def test_a_long_module_and_a_crowded_folder_fail(tmp_path: Path) -> None:
    files = {f"pgpoll/sink/m{i}.py": "" for i in range(MAX_MODULES)}
    files["pgpoll/sink/old_name.py"] = "import sys\nfrom pgpoll.sink import m0 as _moved\nsys.modules[__name__] = _moved\n"
    assert violations(_tree(tmp_path / "a", files)) == []  # twenty modules and an alias: still fine
    files["pgpoll/sink/m_extra.py"] = "x = 1\n" * (MAX_LINES + 1)
    problems = violations(_tree(tmp_path / "b", files))
    assert problems == [
        f"pgpoll/sink/m_extra.py: {MAX_LINES + 1} lines, over {MAX_LINES}: it is two things, split it",
        f"pgpoll/sink/: {MAX_MODULES + 1} modules, over {MAX_MODULES}: group them in sub-packages",
    ], problems


def test_a_cycle_fails_even_through_a_function_level_import(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "pgpoll/cli/main.py": "from pgpoll.cli.ingest import command\n",
        "pgpoll/cli/ingest.py": "def command():\n    from pgpoll.cli.main import report_error\n",
        "pgpoll/cli/other.py": "from pgpoll.cli import main\n",
    })
    problems = violations(root)
    assert len(problems) == 1, problems
    assert problems[0].startswith("import cycle: pgpoll.cli.ingest -> pgpoll.cli.main -> pgpoll.cli.ingest")


def test_a_cycle_through_relative_imports_and_packages_fails(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "pgpoll/sink/__init__.py": "from .a import A\n",
        "pgpoll/sink/a.py": "from pgpoll.ingest.b import B\n",
        "pgpoll/ingest/b.py": "import pgpoll.sink\n",
        "pgpoll/self.py": "from pgpoll import self\n",
    })
    problems = violations(root)
    assert len(problems) == 2, problems
    assert any("pgpoll.ingest.b -> pgpoll.sink -> pgpoll.sink.a -> pgpoll.ingest.b" in p for p in problems)
    assert any("pgpoll.self -> pgpoll.self" in p for p in problems)


def test_a_cycle_fails_even_when_one_side_imports_only_under_type_checking(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "pgpoll/materialize/run.py": "from pgpoll.materialize.engine import compute\nclass Runner: ...\n",
        "pgpoll/materialize/engine.py": (
            "from __future__ import annotations\n"
            "import typing\n"
            "if typing.TYPE_CHECKING:\n"
            "    from pgpoll.materialize.run import Runner\n"
            "def compute(r: Runner) -> None: ...\n"
        ),
    })
    problems = violations(root)
    assert len(problems) == 1, problems
    assert problems[0].startswith("import cycle: pgpoll.materialize.engine -> pgpoll.materialize.run -> "), problems
    assert "engine.py:4 imports pgpoll.materialize.run under TYPE_CHECKING" in problems[0]


def test_the_cycle_rule_counts_type_checking_edges_of_the_graph() -> None:
    def edge(importer: str, target: str, type_checking: bool) -> Import:
        return Import(importer, target, Path(importer.replace(".", "/") + ".py"), 1, type_checking)

    modules = {"pgpoll.a", "pgpoll.b", "pgpoll.c"}
    runtime_only = [edge("pgpoll.a", "pgpoll.b", False), edge("pgpoll.b", "pgpoll.c", False)]
    assert cycles(runtime_only, modules) == []
    [cycle] = cycles([*runtime_only, edge("pgpoll.c", "pgpoll.a", True)], modules)
    assert [(imp.importer, imp.target, imp.type_checking) for imp in cycle] == [
        ("pgpoll.a", "pgpoll.b", False), ("pgpoll.b", "pgpoll.c", False), ("pgpoll.c", "pgpoll.a", True),
    ]
