"""The built site in headless Chromium: the home page and a concept page show their navigation and draw
their Mermaid diagrams as SVG, with every host but the local one unreachable (the site renders offline).

Chromium is Debian's package (``.ci/run`` installs it where missing), driven over its DevTools protocol on a
pipe (:mod:`tests.docs.chromium`); the site is served from a local HTTP server, as ``mkdocs serve`` or any
static server would. The test skips, saying why, only where no Chromium is installed.
"""

from __future__ import annotations

import functools
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.docs.chromium import Node, browser, find_chromium
from tests.docs.conftest import Build

# Every name resolves to nothing but 127.0.0.1: a page that needed a CDN or a web font would break here.
OFFLINE = ("--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1", "--window-size=1280,1000")


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # the base class names it `format`
        pass


@pytest.fixture(scope="module")
def served_site(built_site: Build) -> Iterator[str]:
    assert built_site.returncode == 0, built_site.output
    handler = functools.partial(_QuietHandler, directory=str(built_site.site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def chromium() -> str:
    found = find_chromium()
    if found is None:
        pytest.skip("chromium is not installed (Debian: apt-get install chromium; .ci/run installs it)")
    return found


def _diagrams(doc: Node) -> list[Node]:
    """The hosts Material draws each Mermaid diagram into (a div.mermaid with a closed shadow root)."""
    return [n for n in doc.find_all("div", "mermaid")]


def _drawn(doc: Node, expected: int) -> bool:
    diagrams = _diagrams(doc)
    return len(diagrams) >= expected and all(d.find_all("svg") for d in diagrams)


@pytest.mark.parametrize(("page", "title", "diagrams"), [
    ("/", "pgpoll", 1),
    ("/concepts/peek-then-advance/", "Peek, then advance", 1),  # checkout-paths: data
])
def test_page_renders_with_navigation_and_diagrams(chromium: str, served_site: str, tmp_path: Path, page: str,
                                                   title: str, diagrams: int) -> None:
    with browser(chromium, OFFLINE) as b:
        session = b.open(served_site + page)
        doc = b.wait_for(session, lambda d: _drawn(d, diagrams), timeout=60)
        b.screenshot(session, tmp_path / "page.png")  # kept by pytest for a look when this fails
        requested = b.requested_urls(session)

    headings = [h.text().replace("¶", "").strip() for h in doc.find_all("h1")]  # ¶: the permalink
    assert title in headings, headings
    # the navigation: the tabs across the top and the sections of the sidebar, with their links
    tabs = [a.text().strip() for a in doc.find_all("a", "md-tabs__link")]
    assert tabs[:4] == ["Home", "Getting started", "Concepts", "How-to guides"], tabs
    sidebar = {a.text().strip() for a in doc.find_all("nav") if "md-nav--primary" in a.classes()
               for a in a.find_all("a", "md-nav__link")}
    assert {"Slots and LSNs", "Command line", "Exit codes", "Schedule with Airflow"} <= sidebar, sidebar
    # each diagram drawn: an SVG with the diagram's nodes in it, not the Mermaid source text
    drawn = _diagrams(doc)
    assert len(drawn) == diagrams
    for diagram in drawn:
        svg = diagram.find_all("svg")[0]
        assert svg.attributes.get("id", "").startswith("__mermaid_"), svg.attributes
        assert svg.find_all("g"), "an empty SVG"
    # everything came from the local server (data: URLs are inline)
    assert requested and all(u.startswith((served_site, "data:")) for u in requested), requested
    assert any(u.endswith("/assets/vendor/mermaid/mermaid.min.js") for u in requested)  # checkout-paths: data
