"""``jobs/airflow/pgpoll_dag.py`` in a real Airflow 3: the DAG folder loads, ``airflow dags test`` lands the changes.

Then the ``materialize`` task writes their current state; a busy slot, a missing ``materialize`` configuration
and configuration errors end the tasks skipped, or failed without retries, as :mod:`pgpoll.airflow` says.

Opt-in: Airflow pins many packages, so it lives in its own virtualenv
(``make airflow-venv`` builds ``.venv-airflow``; ``PGPOLL_AIRFLOW_VENV`` points
elsewhere). Set ``PGPOLL_TEST_AIRFLOW=1`` to run these tests; with it set and
no Airflow venv, they fail rather than skip. The DAG folder holds only the DAG
file, as a user's does; its operators (:mod:`pgpoll.airflow.operators`) come
from pgpoll installed in that venv without its dependencies, as a user installs
it (``make airflow-venv`` does, editable: this checkout's code).
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import psycopg2
import pyarrow.dataset as pads
import pytest

from pgpoll.lsn import Lsn
from pgpoll.sink.commit.lease import Lease
from pgpoll.sink.stores.filesystem import open_output
from tests.ingest.conftest import REPO, confirmed_lsn, make_capture
from tests.jobs.standalone import SPARK_HOME, spark_env

pytestmark = [
    pytest.mark.airflow,
    pytest.mark.skipif(
        os.environ.get("PGPOLL_TEST_AIRFLOW") != "1",
        reason="opt-in: run `make airflow-venv`, then set PGPOLL_TEST_AIRFLOW=1 (Airflow lives in its own venv)",
    ),
]

AIRFLOW_VENV = Path(os.environ.get("PGPOLL_AIRFLOW_VENV", REPO / ".venv-airflow"))
DAG_FOLDER = REPO / "jobs" / "airflow"


@pytest.fixture
def airflow(tmp_path: Path) -> Any:
    """``airflow(*args, env=...)`` from the Airflow venv, with a fresh AIRFLOW_HOME and SQLite database."""
    binary = AIRFLOW_VENV / "bin" / "airflow"
    assert binary.exists(), f"no Airflow at {binary}: run `make airflow-venv` (or set PGPOLL_AIRFLOW_VENV)"
    found = subprocess.run([str(AIRFLOW_VENV / "bin" / "python"), "-c", "import pgpoll.airflow; print(pgpoll.__file__)"],
                           capture_output=True, text=True, timeout=60)
    assert found.returncode == 0 and Path(found.stdout.strip()).resolve() == REPO / "pgpoll" / "__init__.py", (
        f"the Airflow venv {AIRFLOW_VENV} does not import this checkout's pgpoll.airflow: run `make airflow-venv` "
        f"(it installs pgpoll there, editable, without its dependencies): {found.stdout}{found.stderr[-2000:]}"
    )
    home = tmp_path / "airflow"
    bindir = tmp_path / "bin"  # spark-submit on PATH, as the provider requires
    bindir.mkdir()
    (bindir / "spark-submit").symlink_to(SPARK_HOME / "bin" / "spark-submit")
    (tmp_path / "spark-conf").mkdir()
    base = spark_env(
        tmp_path / "spark-conf",
        PATH=f"{bindir}:{os.environ['PATH']}",
        PYSPARK_PYTHON=sys.executable,  # the driver's Python: pgpoll and its dependencies
        AIRFLOW_HOME=str(home),
        AIRFLOW__CORE__DAGS_FOLDER=str(DAG_FOLDER),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{home}/airflow.db",
        AIRFLOW_CONN_PGPOLL_SPARK=json.dumps({"conn_type": "spark", "host": "local[1]"}),
    )
    base.pop("VIRTUAL_ENV", None)

    def run(*args: str, env: dict[str, str] | None = None, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(binary), *args], env={**base, **(env or {})}, cwd=tmp_path,
            capture_output=True, text=True, timeout=timeout,
        )

    run.home = home  # type: ignore[attr-defined]
    run.python = AIRFLOW_VENV / "bin" / "python"  # type: ignore[attr-defined]
    run.env = base  # type: ignore[attr-defined]
    migrated = run("db", "migrate")
    assert migrated.returncode == 0, migrated.stderr[-3000:]
    return run


def test_the_dag_folder_loads_with_no_import_errors_and_the_schedule_from_the_variable(airflow: Any) -> None:
    script = textwrap.dedent(
        f"""
        import json
        from airflow.dag_processing.dagbag import DagBag
        bag = DagBag(dag_folder={str(DAG_FOLDER)!r})
        dag = bag.get_dag("pgpoll_ingest")
        task = dag.get_task("ingest")
        materialize = dag.get_task("materialize")
        snapshot_dag = bag.get_dag("pgpoll_snapshot")
        snapshot = snapshot_dag.get_task("snapshot")
        housekeeping_dag = bag.get_dag("pgpoll_housekeeping")
        print(json.dumps({{
            "housekeeping": {{
                "schedule": str(housekeeping_dag.schedule),
                "tasks": sorted(housekeeping_dag.task_ids),
                "operator": type(housekeeping_dag.get_task("housekeeping")).__name__,
            }},
            "import_errors": {{str(k): str(v) for k, v in bag.import_errors.items()}},
            "dags": sorted(bag.dag_ids),
            "schedule": str(dag.schedule),
            "catchup": dag.catchup,
            "max_active_runs": dag.max_active_runs,
            "retries": task.retries,
            "exponential": task.retry_exponential_backoff,
            "operator": [type(task).__name__, [c.__name__ for c in type(task).__mro__]],
            "tasks": sorted(dag.task_ids),
            "materialize": {{
                "upstream": sorted(materialize.upstream_task_ids),
                "trigger_rule": getattr(materialize.trigger_rule, "value", materialize.trigger_rule),
                "retries": materialize.retries,
                "operator": [type(materialize).__name__, [c.__name__ for c in type(materialize).__mro__]],
            }},
            "snapshot": {{
                "schedule": snapshot_dag.schedule,
                "max_active_runs": snapshot_dag.max_active_runs,
                "params": {{k: snapshot_dag.params.get_param(k).resolve() for k in snapshot_dag.params}},
                "tasks": sorted(snapshot_dag.task_ids),
                "retries": snapshot.retries,
                "exponential": snapshot.retry_exponential_backoff,
                "operator": [type(snapshot).__name__, [c.__name__ for c in type(snapshot).__mro__]],
            }},
        }}))
        """
    )
    env = {**airflow.env, "AIRFLOW_VAR_PGPOLL_SCHEDULE": "7,37 * * * *"}
    proc = subprocess.run([str(airflow.python), "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["import_errors"] == {}
    assert seen["dags"] == ["pgpoll_housekeeping", "pgpoll_ingest", "pgpoll_snapshot"]
    assert seen["tasks"] == ["ingest", "materialize"]
    assert seen["housekeeping"] == {"schedule": "@daily", "tasks": ["housekeeping"],
                                    "operator": "PgpollHousekeepingOperator"}  # compact, then retain (daily)
    assert seen["schedule"] == "7,37 * * * *"  # from the Variable pgpoll_schedule
    assert seen["catchup"] is False and seen["max_active_runs"] == 1
    assert seen["retries"] == 4 and seen["exponential"] is True
    assert seen["operator"][0] == "PgpollIngestOperator" and "SparkSubmitOperator" in seen["operator"][1]
    operator = seen["materialize"].pop("operator")
    assert operator[0] == "PgpollMaterializeOperator" and "SparkSubmitOperator" in operator[1]
    # runs only after a successful ingest (skipped after a skipped one), retried like ingest
    assert seen["materialize"] == {"upstream": ["ingest"], "trigger_rule": "all_success", "retries": 4}
    # the snapshot DAG: by hand only, one `tables` parameter (empty: every captured table), retried like ingest
    operator = seen["snapshot"].pop("operator")
    assert operator[0] == "PgpollSnapshotOperator" and "SparkSubmitOperator" in operator[1]
    assert seen["snapshot"] == {
        "schedule": None, "max_active_runs": 1, "params": {"tables": ""}, "tasks": ["snapshot"],
        "retries": 4, "exponential": True,
    }

    # the same through Airflow itself: its DAG processor parses the folder into the metadata
    # database, with the schedule from a Variable stored there
    assert airflow("variables", "set", "pgpoll_schedule", "1 2 * * *").returncode == 0
    processed = airflow("dag-processor", "--num-runs", "1", timeout=300)
    assert processed.returncode == 0, processed.stderr[-3000:]
    errors = airflow("dags", "list-import-errors", "-o", "json")
    assert errors.returncode == 0 and json.loads(errors.stdout.strip().splitlines()[-1]) == []
    details = airflow("dags", "details", "pgpoll_ingest", "-o", "json")
    [parsed] = json.loads(details.stdout.strip().splitlines()[-1])
    assert parsed["timetable_summary"] == "1 2 * * *" and parsed["has_import_errors"] == "False"
    assert parsed["max_active_runs"] == "1"


def _task_instances(home: Path, task_id: str = "ingest", dag_id: str = "pgpoll_ingest") -> list[tuple[str, str, int]]:
    with sqlite3.connect(home / "airflow.db") as conn:
        return conn.execute(
            "SELECT run_id, state, try_number FROM task_instance WHERE dag_id = ? AND task_id = ? ORDER BY run_id",
            (dag_id, task_id),
        ).fetchall()


def _xcom(home: Path, run_id: str, key: str, task_id: str = "ingest", dag_id: str = "pgpoll_ingest") -> Any:
    with sqlite3.connect(home / "airflow.db") as conn:
        rows = conn.execute(
            "SELECT value FROM xcom WHERE dag_id = ? AND task_id = ? AND run_id = ? AND key = ?",
            (dag_id, task_id, run_id, key),
        ).fetchall()
    assert len(rows) == 1, f"no XCom {key} of {task_id} for {run_id}"
    value = rows[0][0]
    return json.loads(value if isinstance(value, str) else bytes(value).decode())


def _source(db: Any) -> str:
    """The Connection pgpoll_source for ``db``, as Airflow reads it from the environment."""
    params = psycopg2.extensions.parse_dsn(db.dsn)
    return json.dumps({
        "conn_type": "postgres", "host": params["host"], "port": int(params["port"]),
        "login": params["user"], "password": params["password"], "schema": params["dbname"],
    })


def test_airflow_dags_test_lands_the_changes_materializes_them_and_a_busy_slot_is_skipped(
    db: Any, tmp_path: Path, airflow: Any
) -> None:
    cap = make_capture(db, "pgoutput", tmp_path / "out")
    db.execute("INSERT INTO items SELECT g, 'v' || g FROM generate_series(1, 200) g")
    db.execute("DELETE FROM items WHERE id <= 5")
    params = psycopg2.extensions.parse_dsn(db.dsn)
    state_dir = tmp_path / "state"
    config = {
        "application": str(REPO / "jobs" / "ingest.py"), "slot": cap.slot, "output": cap.output,
        "publication": "pub_items", "max_seconds": 300, "typed_tables": True,
        "materialize": {"application": str(REPO / "jobs" / "materialize.py"), "to": str(state_dir)},
    }
    env = {"AIRFLOW_CONN_PGPOLL_SOURCE": _source(db), "AIRFLOW_VAR_PGPOLL_INGEST": json.dumps(config)}

    first = airflow("dags", "test", "pgpoll_ingest", "2024-01-02T00:00:00+00:00", env=env)

    assert first.returncode == 0, (first.stdout + first.stderr)[-5000:]
    [(run_id, state, _tries)] = _task_instances(airflow.home)
    assert state == "success"
    summary = _xcom(airflow.home, run_id, "return_value")
    assert summary["status"] == "ok" and summary["changes"] == 205 and summary["slot"] == cap.slot
    table = pads.dataset(Path(cap.output) / "changes", format="parquet", partitioning="hive").to_table()
    ops = table.column("op").to_pylist()
    assert (ops.count("I"), ops.count("D")) == (200, 5)
    assert Lsn.parse(confirmed_lsn(db, cap.slot)) == Lsn.parse(summary["last_lsn"])
    assert params["password"] not in " ".join(json.dumps(summary).split())
    assert (Path(cap.output) / "tables" / "public.items").is_dir()  # typed_tables: true -> --typed-tables

    # materialize ran after the ingest: one JSON line per captured table, as its XCom return_value
    assert _task_instances(airflow.home, "materialize") == [(run_id, "success", 1)]
    [items] = _xcom(airflow.home, run_id, "return_value", "materialize")
    assert (items["table"], items["rows"], items["mode"]) == ("public.items", 195, "full")
    assert Path(items["path"].removeprefix("file:")) == state_dir / "public.items"  # "to" -> --to
    current = pads.dataset(state_dir / "public.items", format="parquet").to_table()
    assert sorted(current.column("id").to_pylist()) == list(range(6, 201))

    # the snapshot DAG, by hand, with the same Variable: the real jobs/snapshot.py reads the table's rows
    # (the 195 that exist now, which ingest also captured) into the same output
    snap_env = {**env, "AIRFLOW_VAR_PGPOLL_INGEST": json.dumps(
        {**config, "snapshot": {"application": str(REPO / "jobs" / "snapshot.py"), "parallelism": 1}})}
    snap = airflow("dags", "test", "pgpoll_snapshot", "2024-01-02T12:00:00+00:00", "--conf",
                   json.dumps({"tables": "public.items"}), env=snap_env)
    assert snap.returncode == 0, (snap.stdout + snap.stderr)[-5000:]
    snap_runs = [(r, st) for r, st, _t in _task_instances(airflow.home, "snapshot", "pgpoll_snapshot")]
    assert len(snap_runs) == 1 and snap_runs[0][1] == "success", snap_runs
    snapped = _xcom(airflow.home, snap_runs[0][0], "return_value", "snapshot", "pgpoll_snapshot")
    assert snapped["status"] == "ok" and snapped["rows"] == 195 and snapped["tables"] == 1, snapped
    assert list((Path(cap.output) / "_pgpoll" / "snapshots").glob("*/complete.json"))

    # another run holds the output's lease: pgpoll exits 3 and the task ends skipped, not failed or retried;
    # materialize (trigger rule all_success) is skipped with it
    holder = Lease(open_output(config["output"]), run="another-run", slot=cap.slot, enabled=True)
    holder.acquire()
    db.execute("INSERT INTO items VALUES (1000, 'waits')")
    second = airflow("dags", "test", "pgpoll_ingest", "2024-01-03T00:00:00+00:00", env=env)
    holder.release()

    assert second.returncode == 0, (second.stdout + second.stderr)[-5000:]
    states = {r: (state, tries) for r, state, tries in _task_instances(airflow.home)}
    busy_run = next(r for r in states if r != run_id)
    assert states[busy_run] == ("skipped", 1)
    assert _xcom(airflow.home, busy_run, "summary")["exit_code"] == 3
    assert Lsn.parse(confirmed_lsn(db, cap.slot)) == Lsn.parse(summary["last_lsn"])  # nothing consumed
    assert (busy_run, "skipped", 0) in _task_instances(airflow.home, "materialize")

    # no "materialize" in the Variable: the task skips itself before any spark-submit (`airflow tasks test`
    # runs just that task; in a DAG run, a skipped leaf task leaves the run successful)
    del config["materialize"]
    alone = airflow("tasks", "test", "pgpoll_ingest", "materialize", "2024-01-04T00:00:00+00:00",
                    env={**env, "AIRFLOW_VAR_PGPOLL_INGEST": json.dumps(config)})

    out = alone.stdout + alone.stderr
    assert "materialize is not configured" in out and "new_state=skipped" in out, out[-5000:]
    assert "Spark-Submit cmd" not in out  # the hook logs the command when it submits
    assert pads.dataset(state_dir / "public.items", format="parquet").count_rows() == 195  # untouched


def test_configuration_errors_fail_the_task_at_once_without_retries(db: Any, tmp_path: Path, airflow: Any) -> None:
    env = {
        "AIRFLOW_CONN_PGPOLL_SOURCE": _source(db),
        "AIRFLOW_VAR_PGPOLL_INGEST": json.dumps({
            "application": str(REPO / "jobs" / "ingest.py"), "slot": "Not-A-Slot-Name", "output": str(tmp_path / "out"),
        }),
    }

    run = airflow("dags", "test", "pgpoll_ingest", "2024-01-02T00:00:00+00:00", env=env)

    [(run_id, state, tries)] = _task_instances(airflow.home)
    assert (state, tries) == ("failed", 1), (run.stdout + run.stderr)[-5000:]  # exit 2: retries=4 is not used
    assert _xcom(airflow.home, run_id, "summary")["exit_code"] == 2
    assert _task_instances(airflow.home, "materialize") == [(run_id, "upstream_failed", 0)]

    # materialize alone (`airflow tasks test`: no ingest first, one spark-submit) on an output with no pgpoll
    # output: exit 5 (spark-submit passes on the driver's exit code), failed at once, not retried
    env["AIRFLOW_VAR_PGPOLL_INGEST"] = json.dumps({
        "output": str(tmp_path / "empty"), "materialize": {"application": str(REPO / "jobs" / "materialize.py")},
    })

    alone = airflow("tasks", "test", "pgpoll_ingest", "materialize", "2024-01-03T00:00:00+00:00", env=env)

    out = alone.stdout + alone.stderr  # (tasks test keeps no task instance to look at afterwards)
    assert "AirflowFailException: pgpoll materialize exited 5" in out and "holds no pgpoll output" in out, out[-5000:]
    assert "new_state=failed" in out and "up_for_retry" not in out  # retries=4 is not used



# Stands in for jobs/snapshot.py as the spark-submit application (the DAG's side only: the command it builds,
# the environment it passes and what it makes of each exit code): records its argv and DSN, prints a summary
# line like pgpoll's (or only an error line), exits with the code it is told to.
SNAPSHOT_STUB = """
import json, os, sys
code = int(os.environ.get("STUB_EXIT", "0"))
with open(os.environ["STUB_RECORD"], "a") as record:
    record.write(json.dumps({"argv": sys.argv[1:], "dsn": os.environ.get("PGPOLL_DSN")}) + "\\n")
if os.environ.get("STUB_SILENT"):
    print("error: the output is not usable (stub)", file=sys.stderr)
else:
    print(json.dumps({"tables": 1, "chunks": 2, "rows": 7, "status": "ok" if code == 0 else "failed",
                      "exit_code": code}))
sys.exit(code)
"""

# Several runs of pgpoll_snapshot in one Airflow process: `Dag.test()` is what `airflow dags test` calls (a real
# DAG run in the metadata database, the task run by Airflow's task runner); one process saves Airflow's start-up
# per run. Each case sets the stub's exit code, the Variable and the run's conf; the retried case (exit 4) gets
# retries=1 and no retry delay, so that the run does not wait a minute for its second try.
SNAPSHOT_RUNS = """
import json, os, sys
from datetime import datetime, timedelta, timezone
from airflow.dag_processing.dagbag import DagBag
dag = DagBag(dag_folder=sys.argv[1]).get_dag("pgpoll_snapshot")
task = dag.get_task("snapshot")
results = []
for day, case in enumerate(json.loads(sys.argv[2]), start=2):
    os.environ.update(case["env"])
    if "STUB_SILENT" not in case["env"]:
        os.environ.pop("STUB_SILENT", None)
    if case.get("retry_at_once"):
        task.retries, task.retry_delay, task.retry_exponential_backoff = 1, timedelta(0), False
    run = dag.test(logical_date=datetime(2024, 1, day, tzinfo=timezone.utc), run_conf=case["conf"])
    [ti] = [t for t in run.get_task_instances() if t.task_id == "snapshot"]
    results.append([run.run_id, str(getattr(ti.state, "value", ti.state)), ti.try_number])
print(json.dumps(results))
"""


def test_snapshot_dag_passes_variable_and_tables_to_spark_submit_and_maps_exit_codes(
    tmp_path: Path, airflow: Any
) -> None:
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / "snapshot.py").write_text(SNAPSHOT_STUB)
    record = tmp_path / "record.jsonl"
    source = {"conn_type": "postgres", "host": "db.example", "port": 5433, "login": "cdc",
              "password": "s3cret-pw", "schema": "shop"}
    output = str(tmp_path / "out")
    # snapshot.py is found beside the ingest application; then an explicit one, no publication, no parallelism
    beside = {"application": str(jobs / "ingest.py"), "slot": "orders_slot", "output": output,
              "publication": "orders_pub", "py_files": "", "snapshot": {"parallelism": 3}}
    explicit = {"slot": "orders_slot", "output": output, "snapshot": {"application": str(jobs / "snapshot.py")}}
    cases = [
        {"conf": {}, "env": {"STUB_EXIT": "0", "AIRFLOW_VAR_PGPOLL_INGEST": json.dumps(beside)}},
        {"conf": {"tables": " public.orders, app.item* "},
         "env": {"STUB_EXIT": "3", "AIRFLOW_VAR_PGPOLL_INGEST": json.dumps(explicit)}},
        {"conf": {"tables": "public.nope"}, "env": {"STUB_EXIT": "2"}},
        {"conf": {}, "env": {"STUB_EXIT": "5", "STUB_SILENT": "1"}},  # no summary: spark-submit's own exit code
        {"conf": {}, "env": {"STUB_EXIT": "4"}, "retry_at_once": True},
    ]
    env = {"AIRFLOW_CONN_PGPOLL_SOURCE": json.dumps(source), "STUB_RECORD": str(record)}

    proc = subprocess.run(
        [str(airflow.python), "-c", SNAPSHOT_RUNS, str(DAG_FOLDER), json.dumps(cases)],
        env={**airflow.env, **env}, capture_output=True, text=True, timeout=600,
    )

    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-5000:]
    runs = json.loads(proc.stdout.strip().splitlines()[-1])
    calls = [json.loads(line) for line in record.read_text().splitlines()]
    assert [(state, tries) for _run, state, tries in runs] == [
        ("success", 1),
        ("skipped", 1),  # exit 3: a snapshot of these tables is running; not retried
        ("failed", 1),  # exits 2 and 5: failed at once, retries=4 unused
        ("failed", 1),
        ("failed", 2),  # exit 4 (lock timeout, ...): retried
    ], (proc.stdout + proc.stderr)[-5000:]
    assert len(calls) == 6  # one spark-submit per try

    # no tables: every captured table (no --tables); the DSN, password included, only in the environment
    assert calls[0]["argv"] == ["--slot", "orders_slot", "--output", output, "--json",
                                "--publication", "orders_pub", "--parallelism", "3"]
    assert "s3cret-pw" in calls[0]["dsn"] and "db.example:5433/shop" in calls[0]["dsn"]
    assert all("s3cret-pw" not in " ".join(call["argv"]) for call in calls)
    summary = _xcom(airflow.home, runs[0][0], "return_value", "snapshot", "pgpoll_snapshot")
    assert (summary["status"], summary["rows"], summary["exit_code"]) == ("ok", 7, 0)

    # tables set (spaces trimmed); the summary of a skipped or failed run is the XCom "summary"
    assert calls[1]["argv"] == ["--slot", "orders_slot", "--output", output, "--json",
                                "--tables", "public.orders,app.item*"]
    assert calls[2]["argv"][-2:] == ["--tables", "public.nope"]
    assert _xcom(airflow.home, runs[1][0], "summary", "snapshot", "pgpoll_snapshot")["exit_code"] == 3
    assert _xcom(airflow.home, runs[2][0], "summary", "snapshot", "pgpoll_snapshot")["exit_code"] == 2
    assert "AirflowFailException: pgpoll snapshot exited 5" in proc.stdout + proc.stderr
    assert "the output is not usable (stub)" in proc.stdout + proc.stderr  # pgpoll's error line in the reason
