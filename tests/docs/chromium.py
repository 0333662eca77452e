"""A headless Chromium driven over its DevTools protocol on a pipe (``--remote-debugging-pipe``).

No browser download and no WebSocket library: Debian's ``chromium`` reads CDP commands from its fd 3 and
writes replies and events to its fd 4, one JSON message per NUL-terminated chunk. This is the whole
client the site tests need: open a page, wait until a condition on its DOM holds (shadow roots included,
closed ones too: Material draws each Mermaid diagram into a closed shadow root), list the requests it made.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
    "--disable-sync", "--no-first-run", "--no-default-browser-check", "--disable-extensions", "--mute-audio",
)


def find_chromium() -> str | None:
    """Debian's ``chromium`` (or ``PGPOLL_TEST_CHROMIUM``), or None."""
    explicit = os.environ.get("PGPOLL_TEST_CHROMIUM")
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    return None


@dataclass
class Node:
    """One DOM node as ``DOM.getDocument(pierce=True)`` returns it, children and shadow roots included."""

    name: str
    attributes: dict[str, str]
    children: list[Node] = field(default_factory=list)
    shadow_roots: list[Node] = field(default_factory=list)
    value: str = ""

    @classmethod
    def parse(cls, raw: dict[str, Any]) -> Node:
        attrs = raw.get("attributes", [])
        node = cls(raw.get("localName") or raw.get("nodeName", "").lower(), dict(zip(attrs[::2], attrs[1::2], strict=True)),
                   value=raw.get("nodeValue", ""))
        node.children = [cls.parse(c) for c in raw.get("children", [])]
        if raw.get("contentDocument"):
            node.children.append(cls.parse(raw["contentDocument"]))
        node.shadow_roots = [cls.parse(s) for s in raw.get("shadowRoots", [])]
        return node

    def walk(self) -> Iterator[Node]:
        """This node and every node below it, through shadow roots."""
        yield self
        for child in (*self.shadow_roots, *self.children):
            yield from child.walk()

    def classes(self) -> set[str]:
        return set(self.attributes.get("class", "").split())

    def find_all(self, name: str | None = None, cls: str | None = None) -> list[Node]:
        return [n for n in self.walk() if (name is None or n.name == name) and (cls is None or cls in n.classes())]

    def text(self) -> str:
        return "".join(n.value for n in self.walk() if n.name == "#text")


class Browser:
    """One headless Chromium process with a fresh profile; close it with :meth:`close` (or use :func:`browser`)."""

    def __init__(self, executable: str, extra_flags: tuple[str, ...] = ()) -> None:
        self._profile = tempfile.mkdtemp(prefix="pgpoll-chromium-")
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()

        def child_fds() -> None:  # the browser reads commands on fd 3 and writes replies on fd 4
            commands, replies = os.dup(to_browser_r), os.dup(from_browser_w)  # above 4: dup2 cannot clobber them
            os.dup2(commands, 3)
            os.dup2(replies, 4)

        self.process = subprocess.Popen(
            [executable, *FLAGS, *extra_flags, f"--user-data-dir={self._profile}", "--remote-debugging-pipe",
             "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            preexec_fn=child_fds, pass_fds=(3, 4), start_new_session=True,  # its own process group (see close)
        )
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []

    def _read_message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            if time.monotonic() > deadline:
                raise TimeoutError("no answer from Chromium")
            chunk = os.read(self._from_browser, 1 << 16)
            if not chunk:
                raise RuntimeError(f"Chromium exited: {self._stderr()}")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)  # type: ignore[no-any-return]

    def send(self, method: str, params: dict[str, Any] | None = None, session: str | None = None,
             timeout: float = 30.0) -> dict[str, Any]:
        """Send one command and return its result (events that arrive meanwhile go to :attr:`events`)."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})  # type: ignore[no-any-return]
            self.events.append(reply)

    def open(self, url: str) -> str:
        """A new tab at ``url``, with the Network domain on; returns its session id."""
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = str(self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"])
        self.send("Network.enable", session=session)
        self.send("Page.enable", session=session)
        self.send("Page.navigate", {"url": url}, session=session)
        return session

    def document(self, session: str) -> Node:
        """The tab's whole DOM, shadow roots (open and closed) and frames included."""
        return Node.parse(self.send("DOM.getDocument", {"depth": -1, "pierce": True}, session=session)["root"])

    def wait_for(self, session: str, ready: Callable[[Node], bool], timeout: float = 60.0) -> Node:
        """Poll the DOM until ``ready`` holds; the last DOM is returned either way (the caller asserts)."""
        deadline = time.monotonic() + timeout
        while True:
            doc = self.document(session)
            if ready(doc) or time.monotonic() > deadline:
                return doc
            time.sleep(0.2)

    def requested_urls(self, session: str) -> list[str]:
        """Every URL the tab asked for so far."""
        self.send("Runtime.evaluate", {"expression": "1"}, session=session)  # flush pending events
        return [e["params"]["request"]["url"] for e in self.events
                if e.get("method") == "Network.requestWillBeSent" and e.get("sessionId") == session]

    def screenshot(self, session: str, path: Path) -> None:
        """A PNG of the tab as it is now."""
        data = self.send("Page.captureScreenshot", {"format": "png"}, session=session)["data"]
        path.write_bytes(base64.b64decode(data))

    def _stderr(self) -> str:
        with contextlib.suppress(Exception):
            if self.process.poll() is not None and self.process.stderr is not None:
                return self.process.stderr.read().decode(errors="replace")[-2000:]
        return ""

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.send("Browser.close", timeout=5)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:  # the browser and its helper processes (renderer, GPU, zygote)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        for fd in (self._to_browser, self._from_browser):
            with contextlib.suppress(OSError):
                os.close(fd)
        if self.process.stderr is not None:
            self.process.stderr.close()
        shutil.rmtree(self._profile, ignore_errors=True)


@contextlib.contextmanager
def browser(executable: str, extra_flags: tuple[str, ...] = ()) -> Iterator[Browser]:
    b = Browser(executable, extra_flags)
    try:
        yield b
    finally:
        b.close()
