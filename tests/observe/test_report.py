"""``pgpoll report``: an output with a few hundred committed batches, a gap, a run history and a snapshot, a
real slot, the page opened in headless Chromium (Debian's, every host but loopback unreachable) with its four
charts drawn and its gap and run tables shown.

The batches and the gap are committed through the commit log's own ``create`` (the compare-and-set ingest
and resync commit with), and the runs recorded with the run history's own ``record_run``, so the report
reads the same records the jobs write, without three hundred ingest runs.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from pgpoll.cli.main import cli
from pgpoll.lsn import Lsn
from pgpoll.observe.report import VENDOR, render
from pgpoll.observe.report_data import ReportData, read_output
from pgpoll.observe.run_history import FOLD_AT, RunRecord, record_run
from pgpoll.sink.commit.log import CommitLog
from pgpoll.sink.commit.records import GAP, GAP_VERSION, CommitRecord
from pgpoll.sink.snapshot_store import SnapshotStore
from pgpoll.sink.stores.filesystem import open_output
from tests.docs.chromium import Node, browser, find_chromium

OFFLINE = ("--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1", "--window-size=1280,1000")
BATCHES = 300
RUNS = FOLD_AT + 5
T0 = datetime(2026, 11, 1, tzinfo=UTC)


def _iso(t: datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")


def _fill(output: Path, slot: str) -> None:
    """Three hundred batches, five minutes apart, the 100th one slow to arrive; and one complete snapshot."""
    fs = open_output(str(output))
    log = CommitLog(fs)
    lsn = 0x1000000
    for seq in range(1, BATCHES + 1):
        committed = T0 + timedelta(minutes=5 * seq)
        lag = 900.0 if seq == 100 else 2.0 + seq % 7
        rows = 10 * (seq % 13) + 1
        assert log.create(CommitRecord(
            start=str(Lsn(lsn + 40)), end=str(Lsn(lsn + 4000)), rows=rows, files=[], partition=None, slot=slot,
            plugin="pgoutput", committed_at=_iso(committed), last_commit_ts=_iso(committed - timedelta(seconds=lag)),
            first_commit_ts=_iso(committed - timedelta(seconds=lag + 60)), seq=seq, prev=seq - 1 if seq > 1 else None,
            bytes=rows * 100,
        ))
        lsn += 4096
    assert log.create(CommitRecord(  # pgpoll resync marked a gap after the last batch
        start=str(Lsn(lsn)), end=str(Lsn(lsn)), rows=0, files=[], partition=None, slot=slot, plugin="pgoutput",
        version=GAP_VERSION, seq=BATCHES + 1, prev=BATCHES, kind=GAP, resume=str(Lsn(lsn + 0x5000)),
        committed_at=_iso(T0 + timedelta(minutes=5 * BATCHES + 1)),
    ))
    for n in range(RUNS):  # more than FOLD_AT: some folded into runs.json, the newest still files
        ended = T0 + timedelta(minutes=5 * n + 1)
        failed = n == 7
        record_run(fs, RunRecord(
            run_id=f"run{n:02d}", job="ingest" if n % 4 else "materialize", started_at=_iso(ended - timedelta(
                seconds=30)), ended_at=_iso(ended), seconds=412.5 if n == 11 else 30.0 + n, slot=slot,
            status="error" if failed else "ok", exit_code=4 if failed else 0, batches=n, changes=10 * n,
            error="PublicationNotFoundError" if failed else None,
        ))
    store = SnapshotStore(fs, "20261101T000000Z-ab12")
    store.create_plan({"tables": [{"schema": "public", "table": "items"}]})
    store.write_complete({"snapshot_id": store.snapshot_id, "completed_at": "2026-11-01T00:10:00Z",
                          "convergence_lsn": "0/1000000", "rows": 1234, "tables": ["public.items"]})


def test_the_vendored_chart_library_is_the_file_its_version_names() -> None:
    version = dict(line.split(": ", 1) for line in (VENDOR / "VERSION").read_text().splitlines())
    assert hashlib.sha256((VENDOR / "uPlot.iife.min.js").read_bytes()).hexdigest() == version["sha256"]
    assert "MIT" in (VENDOR / "LICENSE").read_text()


def test_the_page_of_an_output_without_batches_says_so_and_draws_nothing() -> None:
    page = render(ReportData(output="s3://lake/<pg>", generated_at="now"))
    assert "No batch has been committed yet." in page and 'id="chart-rows"' not in page
    assert "s3://lake/&lt;pg&gt;" in page and "<pg>" not in page  # escaped


def test_report_of_hundreds_of_batches_draws_its_charts_offline_in_chromium(db: Any, tmp_path: Path) -> None:
    chromium = find_chromium()
    if chromium is None:
        pytest.skip("chromium is not installed (Debian: apt-get install chromium; .ci/run installs it)")
    slot = db.slot_name()
    db.execute("SELECT 1 FROM pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    out, page = tmp_path / "out", tmp_path / "report.html"
    _fill(out, slot)

    result = CliRunner().invoke(cli, ["report", "--output", str(out), "--html", str(page)], env={"PGPOLL_DSN": db.dsn})
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == f"{page}: {BATCHES} batch(es), 1 snapshot(s), 1 slot(s)"
    text = page.read_text()
    password = db.dsn.split("@")[0].rsplit(":", 1)[1]
    assert password not in text and "<script src" not in text and "<link" not in text  # self-contained
    data = read_output(open_output(str(out)), str(out), "now")
    assert len(data.batches) == BATCHES and data.batches[99].lag_s == 900.0
    assert len(data.runs) == RUNS and (out / "_pgpoll" / "runs.json").exists()  # folded and unfolded alike

    with browser(chromium, OFFLINE) as b:
        session = b.open(page.as_uri())
        doc = b.wait_for(session, lambda d: _charts(d) == 4, timeout=60)
        b.screenshot(session, tmp_path / "report.png")  # kept by pytest for a look when this fails
        requested = b.requested_urls(session)
    assert _charts(doc) == 4
    body = doc.find_all("body")[0]
    assert body.attributes.get("data-charts-drawn") == "4"
    titles = [n.text() for n in doc.find_all("div", "u-title")]
    assert titles == ["Changes per batch", "Throughput between commits", "Lag at commit (age of the newest change)",
                      "Bytes written and WAL read per batch"]
    assert all(url.startswith("file:") for url in requested), requested
    tables = {t.attributes["id"]: t for t in doc.find_all("table") if "id" in t.attributes}
    first = tables["largest-lag"].find_all("tr")[1].find_all("td")
    assert (first[0].text(), first[4].text()) == ("100", "900.0")
    assert slot in tables["slots"].text()
    assert "20261101T000000Z-ab12" in tables["snapshots"].text() and "1,234" in tables["snapshots"].text()
    assert f"{BATCHES:,}" in tables["figures"].text()
    [gap] = [[c.text() for c in r.find_all("td")] for r in tables["gaps"].find_all("tr")[1:]]
    assert gap[0] == str(BATCHES + 1) and gap[3] == str(Lsn(0x1000000 + 4096 * BATCHES + 0x5000))
    jobs = {cells[0]: cells for r in tables["runs"].find_all("tr")[1:] if (cells := [c.text() for c in r.find_all("td")])}
    assert (jobs["ingest"][1:4], jobs["materialize"][1:4]) == (["18", "1", "0"], ["7", "0", "0"])
    assert jobs["ingest"][5] == "412.5"  # the longest
    slowest = tables["slowest-runs"].find_all("tr")[1].find_all("td")
    assert (slowest[1].text(), slowest[2].text()) == ("ingest", "412.5")
    [failed] = [[c.text() for c in r.find_all("td")] for r in tables["failed-runs"].find_all("tr")[1:]]
    assert failed[1:6] == ["ingest", "37.0", "error", "4", "PublicationNotFoundError"]


def _charts(doc: Node) -> int:
    """uPlot charts drawn: each a div.uplot holding a canvas with a size."""
    return sum(1 for u in doc.find_all("div", "uplot") if any(c.attributes.get("width") for c in u.find_all("canvas")))
