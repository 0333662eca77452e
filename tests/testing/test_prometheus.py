"""The test Prometheus: a server that does not start stops the one that did (nothing is left running)."""

from __future__ import annotations

import shutil
import urllib.request

import pytest

from pgpoll.testing.prometheus import Monitoring, missing


@pytest.mark.skipif(bool(missing()), reason="prometheus or prometheus-pushgateway not installed")
def test_a_prometheus_that_exits_at_start_stops_the_pushgateway_already_running(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    false = shutil.which("false")
    assert false is not None
    monkeypatch.setenv("PGPOLL_TEST_PROMETHEUS", false)  # "prometheus" exits 1 at once; the Pushgateway starts
    monitoring = Monitoring()
    with pytest.raises(RuntimeError, match="exited 1"):
        monitoring.start()
    assert monitoring.processes == [] and monitoring.root is not None and not monitoring.root.exists()
    with pytest.raises(OSError):  # the Pushgateway was up (the start waited for it) and is stopped
        urllib.request.urlopen(monitoring.pushgateway_url + "/-/ready", timeout=2)
