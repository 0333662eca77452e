"""``pgpoll report``: an output with a few hundred committed batches and a snapshot, a real slot, the page
opened in headless Chromium (Debian's, every host but loopback unreachable) with its four charts drawn.

The batches are committed through the commit log's own ``create`` (the compare-and-set ingest commits
with), so the report reads the same records ingest writes, three hundred of them without three hundred
ingest runs.
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
from pgpoll.sink.commit.log import CommitLog
from pgpoll.sink.commit.records import CommitRecord
from pgpoll.sink.snapshot_store import SnapshotStore
from pgpoll.sink.stores.filesystem import open_output
from tests.docs.chromium import Node, browser, find_chromium

OFFLINE = ("--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1", "--window-size=1280,1000")
BATCHES = 300
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


def _charts(doc: Node) -> int:
    """uPlot charts drawn: each a div.uplot holding a canvas with a size."""
    return sum(1 for u in doc.find_all("div", "uplot") if any(c.attributes.get("width") for c in u.find_all("canvas")))
