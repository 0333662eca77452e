"""A new user's first hour, as the Getting started pages tell it, run against a throwaway PostgreSQL.

Every command block of ``docs/getting-started/`` carries a marker (see :mod:`tests.docs.doc_blocks`);
the ``run`` blocks of all pages are run in the navigation's order in one bash session, as a reader would
type them, with only the example names replaced: the server (``db.example.com``), the paths under
the example data directory (``data/pg`` at the root) and, so that nothing collides on a shared
server, the role and slot names. Two tables stand
for the reader's application; ``app-sql`` markers write to them between steps. At the end the
materialized state must equal the source, table by table.

Spark (``snapshot``, ``materialize``) runs with a ``spark-defaults.conf`` holding the settings of the
suite's shared session: a local master of two cores, two shuffle partitions, no UI.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg2.extensions
import pyarrow.dataset as ds
import pytest

from pgpoll.testing.cluster import find_bindirs
from tests.docs.doc_blocks import COMMAND_LANGUAGES, OUTPUT_LANGUAGES, Block, blocks, unmarked

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "docs" / "getting-started" / name
         for name in ("index.md", "demo.md", "own-database.md", "first-snapshot.md", "first-schedule.md")]

APPLICATION = """
CREATE TABLE public.customers (id serial PRIMARY KEY, name text NOT NULL);
CREATE TABLE public.orders (id serial PRIMARY KEY, customer_id int NOT NULL, total numeric(10, 2),
                            status text NOT NULL DEFAULT 'new', note text);
INSERT INTO public.customers (name) VALUES ('Ada'), ('Grace'), ('Edsger');
INSERT INTO public.orders (customer_id, total, note) SELECT 1 + g % 3, g * 10.25, repeat('x', g) FROM generate_series(1, 10) g;
"""

# What the suite's shared SparkSession uses (pgpoll.testing.pytest_plugin), as a user's spark-defaults.conf:
# with Spark's default of 200 shuffle partitions, materializing two small tables on two cores takes ~30 s more.
SPARK_DEFAULTS = """\
spark.master local[2]
spark.ui.enabled false
spark.sql.shuffle.partitions 2
"""


def test_every_command_block_is_run_skipped_or_covered() -> None:
    for page in PAGES:
        found = blocks(page)
        assert not unmarked(found), (
            "unmarked command blocks (add <!-- test: run -->, <!-- test: skip REASON --> or "
            f"<!-- test: covered by PATH -->): {[b.where() for b in unmarked(found)]}")
        for block in found:
            assert block.language in COMMAND_LANGUAGES | OUTPUT_LANGUAGES | {"app-sql"}, (
                f"{block.where()}: unknown block language {block.language!r}")
            if block.marker == "skip":
                assert block.note, f"{block.where()}: a skipped block says why"
            if block.marker == "covered by":
                covering = block.note.split()[0]
                assert (ROOT / covering).exists(), f"{block.where()}: {covering} does not exist"
    assert any(b.marker == "run" for page in PAGES for b in blocks(page))


def test_the_marker_parser_sees_a_missing_marker(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("<!-- test: run -->\n```sh\necho marked\n```\n\ntext\n\n```sh\necho unmarked\n```\n"
                    "```text\noutput\n```\n<!-- test: app-sql SELECT 1 -->\n")
    found = blocks(page)
    assert [(b.marker, b.language) for b in found] == [("run", "sh"), (None, "sh"), (None, "text"), ("app-sql", "app-sql")]
    assert [b.code for b in unmarked(found)] == ["echo unmarked"]


def _script(found: list[Block], substitutions: dict[str, str]) -> str:
    pattern = re.compile("|".join(re.escape(k) for k in sorted(substitutions, key=len, reverse=True)))
    out = ["set -euo pipefail", 'trap \'echo "getting started: the block at $PGPOLL_DOC_BLOCK failed" >&2\' ERR']
    for block in found:
        if block.marker not in ("run", "app-sql"):
            continue
        code = pattern.sub(lambda m: substitutions[m.group(0)], block.code)  # one pass: no replacement is replaced
        out.append(f"PGPOLL_DOC_BLOCK={shlex.quote(block.where())}; echo \"::: $PGPOLL_DOC_BLOCK at ${{SECONDS}}s\"")
        if block.marker == "app-sql":
            out.append(f'psql "$PGPOLL_DOC_SUPERUSER_DSN" -X -q -v ON_ERROR_STOP=1 <<\'PGPOLL_DOC_SQL\'\n{code};\nPGPOLL_DOC_SQL')
        elif block.language in ("python", "py"):
            out.append(f'"$PGPOLL_DOC_PYTHON" - <<\'PGPOLL_DOC_PY\'\n{code}\nPGPOLL_DOC_PY')
        else:
            out.append(code)
    return "\n".join(out) + "\n"


def _rows(db: Any, query: str) -> list[tuple[Any, ...]]:
    return sorted(db.execute(query))


def test_getting_started_runs_as_written(db: Any, tmp_path: Path) -> None:
    db.require_plugin("pgoutput")
    for statement in APPLICATION.strip().split(";\n"):
        db.execute(statement)
    params = psycopg2.extensions.parse_dsn(db.dsn)
    role, slot = f"pgpoll_capture_{db.name}", f"orders_slot_{db.name}"
    host = f"{params.get('host', '127.0.0.1')}:{params.get('port', '5432')}"
    data = tmp_path / "data" / "pg"
    data.mkdir(parents=True)
    substitutions = {
        "postgresql://postgres@db.example.com/appdb": db.dsn,
        "pgpoll_capture@db.example.com/appdb": f"{role}@{host}/{db.name}",
        "pgpoll_capture": role,
        "orders_slot": slot,
        "/data/pg/": f"{data}/",  # checkout-paths: data
    }
    found = [b for page in PAGES for b in blocks(page)]
    bindir = next((inst.bindir for inst in find_bindirs().values() if (inst.bindir / "psql").exists()), None)
    if bindir is None:
        pytest.skip("no psql found beside any PostgreSQL installation")
    spark_conf = tmp_path / "spark-conf"  # the suite's Spark settings (see the module docstring)
    spark_conf.mkdir()
    (spark_conf / "spark-defaults.conf").write_text(SPARK_DEFAULTS)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PGPOLL_", "PG", "SPARK_CONF_DIR"))}
    env.update({
        "SPARK_CONF_DIR": str(spark_conf),
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), str(bindir), env.get("PATH", "")]),
        "PGPOLL_DOC_SUPERUSER_DSN": db.dsn,
        "PGPOLL_DOC_PYTHON": sys.executable,
        "PGPOLL_NO_PROGRESS": "1",
    })
    try:
        done = subprocess.run(["bash", "-c", _script(found, substitutions)], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=600, check=False)
        print(done.stdout)
        assert done.returncode == 0, f"{done.stdout[-6000:]}\n--- stderr ---\n{done.stderr[-6000:]}"

        # What the reader was promised: the state equals the source, the slot is gone.
        for table, columns in (("public.orders", "id, customer_id, total, status"), ("public.customers", "id, name")):
            state = ds.dataset(data / "orders" / "state" / table, format="parquet").to_table()
            got = sorted(tuple(row[c.strip()] for c in columns.split(",")) for row in state.to_pylist())
            assert got == _rows(db, f"SELECT {columns} FROM {table}"), table
        assert not db.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (slot,))
        summaries = [json.loads(line) for line in done.stdout.splitlines() if line.startswith('{"')]
        assert summaries and all(s["status"] == "ok" for s in summaries), summaries
        assert "snapshot_id" in {k for s in summaries for k in s}  # the snapshot's summary line was printed
    finally:
        db.execute(f'DROP OWNED BY "{role}"') if db.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)) else None
        db.execute(f'DROP ROLE IF EXISTS "{role}"')
