"""The run hooks: how a run's end becomes a record (the CLI's exit codes), and where it is not recorded."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from pgpoll.errors import PublicationNotFoundError, SinkError, SlotBusyError
from pgpoll.observe.metrics import output_label
from pgpoll.observe.run_history import load_history
from pgpoll.observe.runs import push_target, run_ended, run_started
from pgpoll.sink import layout
from pgpoll.sink.stores.filesystem import open_output

REPO = Path(__file__).resolve().parents[2]


def test_an_error_becomes_the_cli_exit_code_and_a_stop_an_interrupt(tmp_path: Path) -> None:
    (tmp_path / layout.META).mkdir()
    out = str(tmp_path)
    ended = [
        run_ended(run_started("ingest", output=out, slot="s", pushgateway=""), error=PublicationNotFoundError("x")),
        run_ended(run_started("ingest", output=out, slot="s", pushgateway=""), error=SlotBusyError("x")),
        run_ended(run_started("snapshot", output=out, slot="s", pushgateway=""), error=RuntimeError("x"), stopped=143),
        run_ended(run_started("materialize", output=out, pushgateway=""), changes=4),
    ]
    assert [(r.status, r.exit_code, r.error) for r in ended] == [
        ("error", 4, "PublicationNotFoundError"), ("busy", 3, "SlotBusyError"),
        ("interrupted", 143, "RuntimeError"), ("ok", 0, None)]
    history = load_history(open_output(out))
    assert [r.run_id for r in history.records] == [r.run_id for r in ended]
    assert history.totals["ingest"].failures == 2 and history.totals["snapshot"].interrupted == 1


def test_a_failed_run_leaves_a_missing_output_missing_and_a_sink_error_unrecorded(tmp_path: Path) -> None:
    typo = tmp_path / "typo"
    run_ended(run_started("ingest", output=str(typo), slot="s", pushgateway=""), error=PublicationNotFoundError("x"))
    assert not typo.exists()
    (tmp_path / "out" / layout.META).mkdir(parents=True)
    run_ended(run_started("ingest", output=str(tmp_path / "out"), slot="s", pushgateway=""), error=SinkError("x"))
    assert load_history(open_output(str(tmp_path / "out"))).records == []
    run_ended(run_started("ingest", output=str(typo), slot="s", pushgateway=""))  # a success creates it
    assert len(load_history(open_output(str(typo))).records) == 1


def test_the_pushgateway_url_loses_its_credentials_and_an_ipv6_host_keeps_its_brackets() -> None:
    assert push_target("http://u:p@[::1]:9091") == ("http://[::1]:9091", "u", "p")
    assert push_target("https://[2001:db8::7]/base") == ("https://[2001:db8::7]/base", None, None)
    assert push_target("http://user@gw.example:9091/x?q=1") == ("http://gw.example:9091/x", "user", None)
    assert push_target("gw:9091") == ("gw:9091", None, None)  # no scheme: as given (the client adds http://)
    assert output_label("s3://k:s@[fd00::1]:9000/lake?x=1") == "s3://[fd00::1]:9000/lake"


def test_a_run_imports_no_prometheus_client_until_it_pushes() -> None:
    """prometheus_client costs about a tenth of a second to import: not on every run without a Pushgateway."""
    code = ("import sys, pgpoll.cli.main, pgpoll.ingest.run, pgpoll.snapshot.run, pgpoll.materialize.run;"
            "print(sorted(m for m in sys.modules if m.startswith('prometheus_client')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "[]", out.stdout
