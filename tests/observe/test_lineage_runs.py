"""OpenLineage events of real runs, caught by a local HTTP receiver (the HTTP transport's peer on loopback).

One source table, one output: ingest (typed tables), snapshot and materialize each send START then COMPLETE
with their datasets; a failing ingest sends FAIL and keeps its exit code; nothing is sent without a
configuration or when lineage is disabled, a lineage server that is down is a warning, and stdout carries
only the summary lines. No event holds the source's password.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from pgpoll.cli.main import cli

RUN = "01931885-2800-7be7-aa8d-aaa15c337267"
ROOT = "01931885-2800-799d-8041-88a263ffa0d8"
OL_VARS = ("OPENLINEAGE_URL", "OPENLINEAGE_CONFIG", "OPENLINEAGE_DISABLED", "OPENLINEAGE_NAMESPACE",
           "OPENLINEAGE_PARENT_ID", "OPENLINEAGE_ROOT_PARENT_ID", "OPENLINEAGE_ENDPOINT", "OPENLINEAGE_API_KEY")


class Receiver:
    """A lineage server's stand-in: keeps every JSON body POSTed to it."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.bodies: list[str] = []
        events, bodies = self.events, self.bodies

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0"))).decode()
                bodies.append(body)
                events.append(json.loads(body))
                self.send_response(201)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def take(self) -> list[dict[str, Any]]:
        out = list(self.events)
        self.events.clear()
        return out

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Receiver]:
    """A receiver, with no other OpenLineage configuration in reach (environment, working directory, home)."""
    for name in OL_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    found = Receiver()
    yield found
    found.close()


def _run(env: dict[str, str], *args: str) -> Any:
    result = CliRunner().invoke(cli, list(args), env=env)
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


def _only_summaries(stdout: str) -> None:
    """stdout holds pgpoll's JSON lines and nothing else: no event, no client chatter."""
    for line in stdout.splitlines():
        if line.strip():
            assert "eventType" not in json.loads(line), line


def _datasets(event: dict[str, Any], side: str) -> dict[str, dict[str, Any]]:
    return {f"{d['namespace']}|{d['name']}": d for d in event[side]}


def _pair(events: list[dict[str, Any]], job: str, end: str = "COMPLETE") -> dict[str, Any]:
    """The run's two events, START then ``end``, of one run id; returns the end event."""
    assert [e["eventType"] for e in events] == ["START", end], events
    start, done = events
    assert start["run"]["runId"] == done["run"]["runId"]
    assert start["job"]["name"] == done["job"]["name"] and done["job"]["name"].startswith(f"pgpoll.{job}.")
    assert done["job"]["facets"]["jobType"]["jobType"] == job.upper()
    assert done["run"]["facets"]["parent"]["run"]["runId"] == RUN
    assert done["run"]["facets"]["parent"]["root"]["run"]["runId"] == ROOT
    return done


def _columns(dataset: dict[str, Any]) -> list[tuple[str, str | None]]:
    return [(f["name"], f.get("type")) for f in dataset["facets"]["schema"]["fields"]]


def test_ingest_snapshot_and_materialize_each_send_start_and_complete_with_their_datasets(
    db: Any, spark: Any, tmp_path: Path, receiver: Receiver,
) -> None:
    db.require_plugin("pgoutput")
    db.execute("CREATE TABLE public.items (id int PRIMARY KEY, note text)")
    db.execute("INSERT INTO public.items VALUES (1, 'before the slot')")
    slot = db.slot_name()
    db.execute("SELECT 1 FROM pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    db.execute("CREATE PUBLICATION p FOR TABLE public.items")
    db.execute("INSERT INTO public.items VALUES (2, 'after'), (3, 'after')")
    out, state = tmp_path / "out", tmp_path / "state"
    env = {"PGPOLL_DSN": db.dsn, "OPENLINEAGE_URL": receiver.url,
           "OPENLINEAGE_PARENT_ID": f"default/pgpoll_dag.ingest/{RUN}",
           "OPENLINEAGE_ROOT_PARENT_ID": f"default/pgpoll_dag/{ROOT}"}
    port, database = db.dsn.rsplit(":", 1)[1].split("/")
    source_ns, source = f"postgres://127.0.0.1:{port}", f"{database}.public.items"
    source_key = f"{source_ns}|{source}"
    changes_key, typed_key = f"file|{out}/changes", f"file|{out}/tables/public.items"

    result = _run(env, "ingest", "--slot", slot, "--publication", "p", "--output", str(out), "--typed-tables")
    assert result.exit_code == 0, result.output
    _only_summaries(result.stdout)
    done = _pair(receiver.take(), "ingest")
    inputs, outputs = _datasets(done, "inputs"), _datasets(done, "outputs")
    assert list(inputs) == [source_key]
    assert _columns(inputs[source_key]) == [("id", "integer"), ("note", "text")]
    assert set(outputs) == {changes_key, typed_key}
    assert outputs[changes_key]["outputFacets"]["outputStatistics"]["rowCount"] == 2
    lineage = outputs[typed_key]["facets"]["columnLineage"]["fields"]
    assert {name: [(f["namespace"], f["name"], f["field"]) for f in spec["inputFields"]]
            for name, spec in lineage.items()} == {"id": [(source_ns, source, "id")], "note": [(source_ns, source, "note")]}

    result = _run(env, "snapshot", "--slot", slot, "--publication", "p", "--output", str(out))
    assert result.exit_code == 0, result.output
    _only_summaries(result.stdout)
    done = _pair(receiver.take(), "snapshot")
    assert list(_datasets(done, "inputs")) == [source_key]
    [snapshot] = done["outputs"]
    assert (snapshot["namespace"], snapshot["name"]) == ("file", f"{out}/snapshots/public.items")
    assert snapshot["facets"]["columnLineage"]["fields"]["note"]["inputFields"][0]["name"] == source

    result = _run(env, "materialize", "--output", str(out), "--to", str(state), "--json")
    assert result.exit_code == 0, result.output
    _only_summaries(result.stdout)
    done = _pair(receiver.take(), "materialize")
    assert list(_datasets(done, "inputs")) == [typed_key]
    [table] = done["outputs"]
    assert table["namespace"] == "file" and table["name"].startswith(str(state))
    assert table["outputFacets"]["outputStatistics"]["rowCount"] == 3
    note = table["facets"]["columnLineage"]["fields"]["note"]["inputFields"]
    assert [(f["namespace"], f["name"], f["field"]) for f in note] == [("file", f"{out}/tables/public.items", "note")]

    # a run that fails: FAIL with the error, and the exit code it has without lineage
    result = _run(env, "ingest", "--slot", slot, "--publication", "missing", "--output", str(out))
    assert result.exit_code == 4, result.output
    done = _pair(receiver.take(), "ingest", "FAIL")
    assert 'publication "missing" does not exist' in done["run"]["facets"]["errorMessage"]["message"]

    password = db.dsn.split("@")[0].rsplit(":", 1)[1]
    assert len(password) >= 8 and not any(password in body for body in receiver.bodies)
    assert not any("password" in body.lower() for body in receiver.bodies)


def test_nothing_is_sent_unconfigured_or_disabled_and_a_server_down_is_only_a_warning(
    db: Any, tmp_path: Path, receiver: Receiver, caplog: pytest.LogCaptureFixture,
) -> None:
    slot = db.slot_name()
    db.execute("SELECT 1 FROM pg_create_logical_replication_slot(%s, 'test_decoding')", (slot,))
    args = ["ingest", "--slot", slot, "--output", str(tmp_path / "out")]

    result = _run({"PGPOLL_DSN": db.dsn}, *args)  # no configuration: no client, nothing on stdout but the summary
    assert result.exit_code == 0, result.output
    [line] = result.stdout.splitlines()
    assert json.loads(line)["status"] == "ok"
    assert "OpenLineage" not in result.stderr and "OpenLineage" not in caplog.text

    result = _run({"PGPOLL_DSN": db.dsn, "OPENLINEAGE_URL": receiver.url, "OPENLINEAGE_DISABLED": "true"}, *args)
    assert result.exit_code == 0 and receiver.take() == []

    # a configuration file without a transport: the client would fall back to the console; pgpoll sends nothing
    (tmp_path / "no-transport.yml").write_text("facets:\n  environment_variables: [HOME]\n")
    caplog.set_level(logging.INFO, logger="openlineage")  # where the console transport would write an event
    result = _run({"PGPOLL_DSN": db.dsn, "OPENLINEAGE_CONFIG": str(tmp_path / "no-transport.yml")}, *args)
    assert result.exit_code == 0, result.output
    [line] = result.stdout.splitlines()
    assert json.loads(line)["status"] == "ok" and '"eventType"' not in caplog.text

    # a lineage server down (a closed port), configured without retry or timeout, the two ways: the run is not
    # held by the client's default retries (~9 s an event before pgpoll's defaults; now one refused connect)
    (tmp_path / "down.yml").write_text(f"transport:\n  type: http\n  url: http://127.0.0.1:{_closed_port()}\n")
    for env in ({"OPENLINEAGE_CONFIG": str(tmp_path / "down.yml")},
                {"OPENLINEAGE_URL": f"http://127.0.0.1:{_closed_port()}"}):
        caplog.clear()
        started = time.monotonic()
        result = _run({"PGPOLL_DSN": db.dsn, **env}, *args)
        took = time.monotonic() - started
        assert result.exit_code == 0, result.output
        assert took < 8, f"a run took {took:.1f} s with its lineage server down ({env})"
        _only_summaries(result.stdout)
        warnings = [r.getMessage() for r in caplog.records if r.name == "pgpoll.observe"]
        assert len(warnings) == 2 and all("not sent" in w for w in warnings), warnings
        assert warnings[0].startswith("OpenLineage START event") and "COMPLETE" in warnings[1]


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released): a connection to it is refused at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_http_transports_get_no_retry_and_a_short_timeout_unless_their_configuration_sets_them(
    receiver: Receiver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from openlineage.client.transport.http_common import DEFAULT_RETRY_CONFIG

    from pgpoll.observe.lineage import HTTP_TIMEOUT, _client, with_defaults

    monkeypatch.setenv("OPENLINEAGE_URL", receiver.url)
    monkeypatch.setenv("OPENLINEAGE_ENDPOINT", "custom/lineage")
    transport = _client().transport
    assert (transport.config.retry["total"], transport.timeout) == (0, HTTP_TIMEOUT)
    assert (transport.url, transport.endpoint) == (receiver.url, "custom/lineage")  # the client's own form kept
    monkeypatch.delenv("OPENLINEAGE_URL")

    (tmp_path / "openlineage.yml").write_text(  # the user's retry and timeout win; pgpoll fills only the gaps
        f"transport:\n  type: http\n  url: {receiver.url}\n  timeout: 2\n  retry:\n    total: 3\n")
    transport = _client().transport
    assert (transport.config.retry["total"], transport.timeout) == (3, 2)
    assert transport.config.retry["backoff_factor"] == DEFAULT_RETRY_CONFIG["backoff_factor"]
    (tmp_path / "openlineage.yml").unlink()
    monkeypatch.setenv("OPENLINEAGE__TRANSPORT__TYPE", "http")
    monkeypatch.setenv("OPENLINEAGE__TRANSPORT__URL", receiver.url)
    monkeypatch.setenv("OPENLINEAGE__TRANSPORT__TIMEOUT", "1.5")
    transport = _client().transport
    assert (transport.config.retry["total"], transport.timeout) == (0, 1.5)

    composite = with_defaults({"type": "composite", "transports": {
        "a": {"type": "http", "url": "http://a"}, "b": {"type": "file", "log_file_path": "x"},
        "c": {"type": "http", "url": "http://c", "retry": {"total": 2}}}})
    assert composite["transports"]["a"] == {"type": "http", "url": "http://a", "timeout": HTTP_TIMEOUT,
                                            "retry": {"total": 0}}
    assert composite["transports"]["b"] == {"type": "file", "log_file_path": "x"}
    assert (composite["transports"]["c"]["retry"], composite["transports"]["c"]["timeout"]) == ({"total": 2}, 5.0)


def test_a_run_that_cannot_reach_its_server_fails_alike_with_lineage_and_its_fail_event_has_no_secret(
    tmp_path: Path, receiver: Receiver,
) -> None:
    dsn = "postgresql://capture:s3cret-pw@127.0.0.1:1/shop"  # nothing listens on port 1: refused at once
    args = ["ingest", "--slot", "s1", "--publication", "p", "--output", str(tmp_path / "out")]
    without = _run({"PGPOLL_DSN": dsn}, *args)
    assert without.exit_code != 0 and receiver.take() == []
    result = _run({"PGPOLL_DSN": dsn, "OPENLINEAGE_URL": receiver.url}, *args)
    assert result.exit_code == without.exit_code, result.output
    _only_summaries(result.stdout)
    start, failed = receiver.take()
    assert (start["eventType"], failed["eventType"]) == ("START", "FAIL")
    assert failed["job"]["name"] == "pgpoll.ingest.s1" and "parent" not in failed["run"]["facets"]
    assert failed["inputs"] == [] and failed["run"]["facets"]["errorMessage"]["message"]
    [changes] = failed["outputs"]
    assert (changes["namespace"], changes["name"]) == ("file", f"{tmp_path}/out/changes")
    assert not any("s3cret-pw" in body for body in receiver.bodies)


def test_the_parent_run_comes_from_the_properties_spark_submit_gives_the_driver(
    spark: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """spark-submit sets each ``--conf`` as a system property of the driver's JVM, which a new ``SparkConf``
    loads; pgpoll reads them from that JVM without starting Spark (the parent, before any SparkSession)."""
    from pgpoll.observe.lineage import _spark_conf
    from pgpoll.observe.lineage_names import Parent, RunRef, parent_run

    props = {"spark.openlineage.parentJobNamespace": "airflow", "spark.openlineage.parentJobName": "dag.ingest",
             "spark.openlineage.parentRunId": RUN, "spark.openlineage.rootParentJobNamespace": "airflow",
             "spark.openlineage.rootParentJobName": "dag", "spark.openlineage.rootParentRunId": ROOT}
    system = spark.sparkContext._jvm.java.lang.System
    monkeypatch.setenv("PYSPARK_GATEWAY_PORT", "1")  # what spark-submit sets for its Python driver (already connected)
    for key, value in props.items():
        system.setProperty(key, value)
    try:
        conf = _spark_conf(None)
    finally:
        for key in props:
            system.clearProperty(key)
    assert conf == props
    assert parent_run({}, conf) == Parent(RunRef("airflow", "dag.ingest", RUN), RunRef("airflow", "dag", ROOT))
    monkeypatch.delenv("PYSPARK_GATEWAY_PORT")
    assert _spark_conf(None) is None  # not under spark-submit: no JVM is started to look


def test_a_stopped_run_ends_with_abort(db: Any, tmp_path: Path, receiver: Receiver, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run stopped by SIGTERM (its summary "interrupted") ends with ABORT, not COMPLETE."""
    import signal

    from pgpoll.ingest.run import IngestOptions, run_ingest
    from pgpoll.stopping import StopRequest

    slot = db.slot_name()
    db.execute("SELECT 1 FROM pg_create_logical_replication_slot(%s, 'test_decoding')", (slot,))
    monkeypatch.setenv("OPENLINEAGE_URL", receiver.url)
    stop = StopRequest()
    stop.request(signal.SIGTERM)  # before the first batch: the run stops at its first safe point
    summary = run_ingest(IngestOptions(slot=slot, output=str(tmp_path / "out"), dsn=db.dsn), stop=stop)
    assert summary.status == "interrupted"
    _start, aborted = receiver.take()
    assert aborted["eventType"] == "ABORT" and aborted["job"]["name"] == f"pgpoll.ingest.{slot}"


def test_a_run_a_stop_cuts_short_with_an_error_ends_with_abort(
    db: Any, tmp_path: Path, receiver: Receiver, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A stop that raises out of the run (materialize's StopRequestedError between tables) ends with ABORT, not
    FAIL, and with no error message: the run was stopped, it did not fail."""
    import signal

    from pgpoll.materialize.run import MaterializeOptions, run_materialize
    from pgpoll.stopping import StopRequest, StopRequestedError
    from tests.ingest.conftest import ingest, make_capture

    capture = make_capture(db, "test_decoding", tmp_path / "out")
    db.execute("INSERT INTO items VALUES (1, 'a')")
    assert ingest(db.dsn, *capture.args("--typed-tables")).exit_code == 0
    monkeypatch.setenv("OPENLINEAGE_URL", receiver.url)
    stop = StopRequest()
    stop.request(signal.SIGINT)
    with pytest.raises(StopRequestedError):
        run_materialize(MaterializeOptions(output=capture.output), stop=stop)
    start, aborted = receiver.take()
    assert (start["eventType"], aborted["eventType"]) == ("START", "ABORT")
    assert aborted["job"]["name"] == start["job"]["name"] and "errorMessage" not in aborted["run"]["facets"]
