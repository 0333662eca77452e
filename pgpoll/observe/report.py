"""``pgpoll report``'s page: one self-contained HTML file from a :class:`ReportData` (pure: data in, text out).

Why one file with everything inline: the report is opened from a laptop, attached to a ticket or kept
beside the output, where there is no server and maybe no internet. The charts are drawn by uPlot (small,
no dependencies, MIT), vendored from npm under ``vendor/uplot/`` (its ``VERSION`` names the release and
the file's hash) and inlined with the data, which is JSON in a ``<script type="application/json">``.

What it shows, over the batches' commit times: the changes per batch, the throughput (changes per second
between two commits), the lag at commit (how old the newest change of a batch was when the batch
committed) and the bytes written and WAL read per batch; then the batches with the largest lag and the
largest batches, the gaps on record (changes missing from the output, marked by ``pgpoll resync``), the
snapshots, and with a DSN the slot now (``pgpoll status``'s figures and alerts). The commit log knows
batches, not runs, so the runs come from the run history: per job how many ran, failed and were
interrupted and how long they took, the slowest runs, and the failed ones with their exit codes.
"""

from __future__ import annotations

import html
import json
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pgpoll.observe.report_data import Batch, ReportData
from pgpoll.observe.run_history import RunRecord

VENDOR = Path(__file__).with_name("vendor") / "uplot"
TOP = 10
CHARTS = (  # (element id, title, y-axis label)
    ("chart-rows", "Changes per batch", "changes"),
    ("chart-throughput", "Throughput between commits", "changes/s"),
    ("chart-lag", "Lag at commit (age of the newest change)", "seconds"),
    ("chart-bytes", "Bytes written and WAL read per batch", "bytes"),
)

_SCRIPT = """
(function () {
  var D = JSON.parse(document.getElementById("report-data").textContent);
  var b = D.batches, t = b.map(function (x) { return x.committed_at; });
  function col(k) { return b.map(function (x) { return x[k]; }); }
  var rate = b.map(function (x, i) {
    var dt = i > 0 ? x.committed_at - b[i - 1].committed_at : 0;
    return dt > 0 ? x.rows / dt : null;
  });
  var series = {
    "chart-rows": [t, col("rows")],
    "chart-throughput": [t, rate],
    "chart-lag": [t, col("lag_s")],
    "chart-bytes": [t, col("bytes"), col("wal")]
  };
  var colors = ["#3f51b5", "#e91e63"];
  var drawn = 0;
  D.charts.forEach(function (c) {
    var el = document.getElementById(c[0]);
    if (!el || !b.length) { return; }
    var data = series[c[0]], s = [{}];
    for (var i = 1; i < data.length; i++) {
      s.push({label: i === 1 ? c[2] : "WAL bytes", stroke: colors[i - 1], width: 1.5,
              points: {show: b.length < 60}});
    }
    new uPlot({title: c[1], width: Math.max(480, el.clientWidth || 900), height: 240, series: s,
               axes: [{}, {label: c[2], size: 70}], scales: {x: {time: true}},
               tzDate: function (ts) { return uPlot.tzDate(new Date(ts * 1e3), "Etc/UTC"); }}, data, el);
    drawn++;
  });
  document.body.setAttribute("data-charts-drawn", String(drawn));
})();
"""

_STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 2em; }
table { border-collapse: collapse; margin: .5em 0; } td, th { border: 1px solid #ccc; padding: 2px 8px; }
td.n { text-align: right; font-variant-numeric: tabular-nums; } .figures td { border: none; }
.chart { margin: 1em 0; }
"""


def vendored() -> tuple[str, str]:
    """uPlot's script and stylesheet, as vendored."""
    return (VENDOR / "uPlot.iife.min.js").read_text(encoding="utf-8"), (VENDOR / "uPlot.min.css").read_text(encoding="utf-8")


def _when(epoch: float | None) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%d %H:%M:%S") if epoch is not None else ""


def _table(head: list[str], rows: list[list[Any]], table_id: str) -> str:
    cells = "".join(
        "<tr>" + "".join(
            f'<td class="n">{v:,}</td>' if isinstance(v, int | float) and not isinstance(v, bool)
            else f"<td>{html.escape('' if v is None else str(v))}</td>" for v in row
        ) + "</tr>"
        for row in rows
    )
    return f'<table id="{table_id}"><tr>' + "".join(f"<th>{html.escape(h)}</th>" for h in head) + f"</tr>{cells}</table>"


def _batch_rows(batches: list[Batch]) -> list[list[Any]]:
    return [[b.seq, _when(b.committed_at), b.rows, b.bytes, b.lag_s, f"{b.start}-{b.end}"] for b in batches]


BATCH_HEAD = ["seq", "committed (UTC)", "changes", "bytes", "lag at commit (s)", "LSN range"]


RUN_HEAD = ["ended (UTC)", "job", "seconds", "status", "exit code", "error", "batches", "changes"]


def _run_rows(runs: list[RunRecord]) -> list[list[Any]]:
    return [[_when(r.ended.timestamp()), r.job, r.seconds, r.status, r.exit_code, r.error, r.batches, r.changes]
            for r in runs]


def _runs(data: ReportData) -> str:
    """Per job: the runs (all ever recorded), how they ended and how long they took (the records kept)."""
    if not data.run_totals:
        return "<p>No run recorded (the run history begins with this version's first run).</p>"
    rows = []
    for job, totals in sorted(data.run_totals.items()):
        took = sorted(r.seconds for r in data.runs if r.job == job)
        last = next((r for r in reversed(data.runs) if r.job == job), None)
        rows.append([job, totals.runs, totals.failures, totals.interrupted,
                     took[len(took) // 2] if took else None, took[-1] if took else None,
                     f"{last.status} ({_when(last.ended.timestamp())})" if last else None])
    kept = f"<p>Durations of the newest {len(data.runs):,} runs ({data.runs_dropped:,} older ones only counted).</p>"
    return _table(["job", "runs", "failed", "interrupted", "median seconds", "longest seconds", "last run"], rows,
                  "runs") + (kept if data.runs_dropped else "")


def _figures(data: ReportData) -> str:
    b = data.batches
    span = (b[-1].committed_at - b[0].committed_at) if len(b) > 1 else 0.0
    figures = [
        ("batches", f"{len(b):,}"), ("changes", f"{sum(x.rows for x in b):,}"),
        ("bytes", f"{sum(x.bytes or 0 for x in b):,}"),
        ("first commit", _when(b[0].committed_at) if b else "none"), ("last commit", _when(b[-1].committed_at) if b else ""),
        ("changes/s over the whole span", f"{sum(x.rows for x in b[1:]) / span:,.1f}" if span > 0 else ""),
        ("snapshots", f"{len(data.snapshots)} ({sum(s.complete for s in data.snapshots)} complete)"),
        ("runs", f"{sum(t.runs for t in data.run_totals.values()):,} "
                 f"({sum(t.failures for t in data.run_totals.values()):,} failed)"),
        ("gaps", f"{len(data.gaps)}"),
    ]
    return '<table id="figures" class="figures">' + "".join(
        f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in figures) + "</table>"


def _slots(slots: list[dict[str, Any]]) -> str:
    if not slots:
        return "<p>No DSN given: the slot is not shown (<code>pgpoll report --dsn ...</code>).</p>"
    rows = [[s.get("slot"), s.get("wal_status"), s.get("lag_bytes"), s.get("lag_seconds"), s.get("safe_wal_size"),
             s.get("position"), ", ".join(s.get("alerts") or []) or "none"] for s in slots]
    return _table(["slot", "wal_status", "lag bytes", "lag seconds", "safe WAL size", "output position", "alerts"], rows, "slots")


def render(data: ReportData) -> str:
    """The report page for ``data``."""
    script, style = vendored()
    by_lag = sorted((b for b in data.batches if b.lag_s is not None), key=lambda b: (-(b.lag_s or 0), b.seq))[:TOP]
    by_size = sorted(data.batches, key=lambda b: (-b.rows, b.seq))[:TOP]
    snapshots = _table(
        ["snapshot", "tables", "complete", "rows", "completed (UTC)", "convergence LSN"],
        [[s.snapshot_id, ", ".join(s.tables), "yes" if s.complete else "no", s.rows, s.completed_at, s.convergence_lsn]
         for s in data.snapshots], "snapshots",
    ) if data.snapshots else "<p>No snapshot.</p>"
    slowest = sorted(data.runs, key=lambda r: (-r.seconds, r.ended_at))[:TOP]
    failed = [r for r in reversed(data.runs) if not r.succeeded and r.status != "interrupted"][:TOP]  # newest first
    gaps = _table(["seq", "marked (UTC)", "missing after LSN", "through LSN"],
                  [[g.seq, g.marked_at, g.after, g.through] for g in data.gaps], "gaps") if data.gaps else (
        "<p>None: the output holds every change since its first batch.</p>")
    payload = json.dumps({"batches": [asdict(b) for b in data.batches], "charts": CHARTS}).replace("</", "<\\/")
    charts = "".join(f'<div class="chart" id="{cid}"></div>' for cid, _title, _label in CHARTS) if data.batches else (
        "<p>No batch has been committed yet.</p>")
    title = f"pgpoll report: {data.output}"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>{style}</style><style>{_STYLE}</style></head>
<body data-charts-drawn="0">
<h1>{html.escape(title)}</h1>
<p>Generated {html.escape(data.generated_at)} from the output's commit log and run history{
    " and the slot" if data.slots else ""}.</p>
{_figures(data)}
<h2>The slot now</h2>
{_slots(data.slots)}
<h2>Over time</h2>
{charts}
<h2>The batches with the largest lag at commit</h2>
{_table(BATCH_HEAD, _batch_rows(by_lag), "largest-lag") if by_lag else "<p>None.</p>"}
<h2>The largest batches</h2>
{_table(BATCH_HEAD, _batch_rows(by_size), "largest-batches") if by_size else "<p>None.</p>"}
<h2>Gaps</h2>
{gaps}
<h2>Runs</h2>
{_runs(data)}
<h2>The slowest runs</h2>
{_table(RUN_HEAD, _run_rows(slowest), "slowest-runs") if slowest else "<p>None.</p>"}
<h2>The newest failed runs</h2>
{_table(RUN_HEAD, _run_rows(failed), "failed-runs") if failed else "<p>None.</p>"}
<h2>Snapshots</h2>
{snapshots}
<script type="application/json" id="report-data">{payload}</script>
<script>{script}</script>
<script>{_SCRIPT}</script>
</body></html>
"""
