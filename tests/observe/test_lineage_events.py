"""OpenLineage names, the parent run, the configuration check and the events, without a server (pure)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from openlineage.client.serde import Serde

from pgpoll.observe.lineage import configured
from pgpoll.observe.lineage_events import Column, DatasetRef, RunLineage, build_event
from pgpoll.observe.lineage_names import Parent, RunRef, location, parent_run, parse_run_ref, server_name

RUN = "01931885-2800-7be7-aa8d-aaa15c337267"
ROOT = "01931885-2800-799d-8041-88a263ffa0d8"


@pytest.mark.parametrize(("dsn", "env", "namespace", "database"), [
    ("postgresql://u:secret@db1.example.com:6432/shop?sslmode=require", {}, "postgres://db1.example.com:6432", "shop"),
    ("postgresql+psycopg2://u:secret@DB1:5433/shop", {}, "postgres://db1:5433", "shop"),
    ("host=a.example.com,b.example.com port=5433,5434 dbname=shop password='se cret'", {},
     "postgres://a.example.com:5433", "shop"),
    ("postgresql://u@a.example.com:5433,b.example.com:5434/shop", {}, "postgres://a.example.com:5433", "shop"),
    ("postgresql://[::1]:5432/shop", {}, "postgres://[::1]:5432", "shop"),
    ("host=/var/run/postgresql dbname=shop", {}, "postgres://localhost:5432", "shop"),  # checkout-paths: data
    ("", {"PGHOST": "pg.internal", "PGPORT": "5555", "PGDATABASE": "crm"}, "postgres://pg.internal:5555", "crm"),
    ("postgresql://u:pw@pgbouncer:6432/shop", {"PGPOLL_LINEAGE_NAMESPACE": "postgres://db1.internal:5432"},
     "postgres://db1.internal:5432", "shop"),
])
def test_the_server_is_named_by_host_port_and_database_and_never_by_a_secret(
    dsn: str, env: dict[str, str], namespace: str, database: str,
) -> None:
    name = server_name(dsn, env)
    assert (name.namespace, name.database) == (namespace, database)
    assert "secret" not in name.namespace and "pw" not in name.namespace.replace("postgres", "")
    assert name.table("public", "orders") == f"{database}.public.orders"


@pytest.mark.parametrize(("uri", "expected"), [
    ("/lake/pg", ("file", "/lake/pg")),  # checkout-paths: data
    ("file:///lake/pg/", ("file", "/lake/pg")),  # checkout-paths: data
    ("s3://Lake/pg/orders", ("s3://lake", "pg/orders")),
    ("s3a://lake/pg", ("s3://lake", "pg")),
    ("gs://lake/pg", ("gs://lake", "pg")),
    ("abfss://data@acct.dfs.core.windows.net/pg", ("abfss://data@acct.dfs.core.windows.net", "pg")),
    ("az://data/pg", ("abfss://data@acct.dfs.core.windows.net", "pg")),
    ("hdfs://nn:8020/lake/pg", ("hdfs://nn:8020", "lake/pg")),
])
def test_outputs_are_named_as_the_openlineage_naming_spec_names_paths(uri: str, expected: tuple[str, str]) -> None:
    assert location(uri, {"AZURE_STORAGE_ACCOUNT_NAME": "acct"}) == expected


def test_the_parent_comes_from_the_environment_then_from_the_spark_properties() -> None:
    assert parse_run_ref(f"airflow/pgpoll_ingest.ingest/{RUN}") == RunRef("airflow", "pgpoll_ingest.ingest", RUN)
    assert parse_run_ref(f"ns/a/b/{RUN}") == RunRef("ns", "a/b", RUN)  # a job name may hold slashes
    assert parse_run_ref("ns/job/not-a-uuid") is None and parse_run_ref("") is None
    env = {"OPENLINEAGE_PARENT_ID": f"default/dag.task/{RUN}", "OPENLINEAGE_ROOT_PARENT_ID": f"default/dag/{ROOT}"}
    assert parent_run(env) == Parent(RunRef("default", "dag.task", RUN), RunRef("default", "dag", ROOT))
    conf = {"spark.openlineage.parentJobNamespace": "default", "spark.openlineage.parentJobName": "dag.task",
            "spark.openlineage.parentRunId": RUN}
    assert parent_run({}, conf) == Parent(RunRef("default", "dag.task", RUN), None)
    assert parent_run({}, {**conf, "spark.openlineage.parentRunId": "x"}) is None
    assert parent_run({}, None) is None


def test_lineage_is_configured_only_the_clients_ways(tmp_path: Path) -> None:
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    cwd.mkdir()
    assert not configured({}, cwd, home)
    assert configured({"OPENLINEAGE_URL": "http://x"}, cwd, home)
    assert configured({"OPENLINEAGE__TRANSPORT__TYPE": "http"}, cwd, home)
    assert not configured({"OPENLINEAGE_URL": "http://x", "OPENLINEAGE_DISABLED": "true"}, cwd, home)
    assert not configured({"OPENLINEAGE_CONFIG": str(tmp_path / "missing.yml")}, cwd, home)
    (cwd / "openlineage.yml").write_text("transport:\n  type: http\n  url: http://x\n")
    assert configured({}, cwd, home)


def test_an_event_carries_the_run_its_datasets_schema_column_lineage_and_parent() -> None:
    source = DatasetRef("postgres://db1:5432", "shop.public.orders", (Column("id", "integer"), Column("note", "text")))
    typed = DatasetRef("s3://lake", "pg/tables/public.orders", (
        Column("id", "int", (("postgres://db1:5432", "shop.public.orders", "id"),)),
    ))
    changes = DatasetRef("s3://lake", "pg/changes", rows=7, size=900)
    run = RunLineage("ingest", "pgpoll", "pgpoll.ingest.s1", RUN, (source,), (changes, typed),
                     Parent(RunRef("default", "dag.task", RUN), RunRef("default", "dag", ROOT)))
    when = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    start = json.loads(Serde.to_json(build_event(run, "START", when)))
    assert start["eventType"] == "START" and start["eventTime"] == "2026-01-02T03:04:05+00:00"
    assert start["run"]["runId"] == RUN and start["job"] == {
        "namespace": "pgpoll", "name": "pgpoll.ingest.s1",
        "facets": {"jobType": start["job"]["facets"]["jobType"]},
    }
    assert start["job"]["facets"]["jobType"]["jobType"] == "INGEST"
    parent = start["run"]["facets"]["parent"]
    assert (parent["job"]["namespace"], parent["job"]["name"], parent["run"]["runId"]) == ("default", "dag.task", RUN)
    assert (parent["root"]["job"]["name"], parent["root"]["run"]["runId"]) == ("dag", ROOT)
    [source_json] = start["inputs"]
    fields = source_json["facets"]["schema"]["fields"]
    assert [(f["name"], f["type"]) for f in fields] == [("id", "integer"), ("note", "text")]
    typed_json = start["outputs"][1]
    [source_field] = typed_json["facets"]["columnLineage"]["fields"]["id"]["inputFields"]
    assert (source_field["namespace"], source_field["name"], source_field["field"]) == (
        "postgres://db1:5432", "shop.public.orders", "id")
    assert [(t["type"], t["subtype"]) for t in source_field["transformations"]] == [("DIRECT", "IDENTITY")]
    assert "outputStatistics" not in json.dumps(start)  # counted only once the run ended
    failed = json.loads(Serde.to_json(build_event(run, "FAIL", when, "slot lost\nfix: recreate it")))
    assert failed["eventType"] == "FAIL"
    assert failed["run"]["facets"]["errorMessage"]["message"] == "slot lost\nfix: recreate it"
    stats = failed["outputs"][0]["outputFacets"]["outputStatistics"]
    assert (stats["rowCount"], stats["size"]) == (7, 900)
