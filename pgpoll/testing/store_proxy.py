"""An HTTP proxy in front of a test store that counts requests and can answer some with throttling errors.

For two things a real store will not do on demand: tell how many requests of
each kind a command made (the benchmark's requests per batch), and throttle
(S3's ``503 SlowDown``) so that retries can be seen working. Requests are
forwarded unchanged, ``Host`` header included, so SigV4 signatures made for
the proxy's address verify at the store.

The proxy runs in a process of its own (``python -m pgpoll.testing.store_proxy``):
delta-rs keeps the GIL while it waits for the store, so a proxy thread in
the caller's process would never answer it. :class:`StoreProxy` starts it and
talks to it through paths no store has (under ``__pgpoll_proxy``).

>>> proxy = StoreProxy("127.0.0.1", seaweed_port).start()   # doctest: +SKIP
>>> proxy.throttle(5)                                          # the next 5 requests get 503 SlowDown
>>> proxy.counts                                               # {"PUT": 12, "GET": 30, "LIST": 4, ...}
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import subprocess
import sys
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

_SLOW_DOWN = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
              b"<Message>Please reduce your request rate.</Message></Error>")
_CONTROL = "/__pgpoll_proxy"
_LOG = os.environ.get("PGPOLL_PROXY_TRACE", "")  # a file to append "KIND path" to for every request (debugging)
_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailers", "upgrade"}


def request_kind(method: str, path: str) -> str:
    """``PUT``, ``GET``, ``HEAD``, ``DELETE``, ``POST``, or ``LIST`` (a GET of a bucket listing)."""
    query = urlparse(path).query
    if method == "GET" and ("list-type=" in query or "delimiter=" in query or "comp=list" in query):
        return "LIST"
    if method == "POST" and "delete" in query:
        return "DELETE"
    return method


class _ProxyState:
    """The proxy process's counts and throttle."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.counts: Counter[str] = Counter()
        self.throttled = 0
        self.throttle = 0
        self.lock = threading.Lock()

    def take(self, kind: str) -> bool:
        """Count a request; True when it is to be throttled."""
        with self.lock:
            if self.throttle > 0:
                self.throttle -= 1
                self.throttled += 1
                return True
            self.counts[kind] += 1
            return False


def serve(target_host: str, target_port: int) -> None:
    """Run the proxy in this process on a free loopback port (printed first on stdout) until killed."""
    state = _ProxyState(target_host, target_port)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet."""

        def handle(self) -> None:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the client gave up (it retries)
                super().handle()

        def _reply(self, status: int, body: bytes, content_type: str = "application/xml") -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _control(self) -> bool:
            parsed = urlparse(self.path)
            if not parsed.path.startswith(_CONTROL):
                return False
            with state.lock:
                body = json.dumps({"counts": dict(state.counts), "throttled": state.throttled}).encode()
                if parsed.path == f"{_CONTROL}/throttle":
                    state.throttle = int(parse_qs(parsed.query)["n"][0])
                elif parsed.path == f"{_CONTROL}/reset":
                    state.counts, state.throttled = Counter(), 0
            self._reply(200, body, "application/json")
            return True

        def _forward(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            if self._control():
                return
            if _LOG:
                with open(_LOG, "a", encoding="utf-8") as trace:
                    trace.write(f"{request_kind(self.command, self.path)} {self.path}\n")
            if state.take(request_kind(self.command, self.path)):
                self._reply(503, _SLOW_DOWN)
                return
            conn = http.client.HTTPConnection(*state.target, timeout=120)
            try:
                # the request as the client sent it: no header added, none reordered
                conn.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
                for name, value in self.headers.items():
                    if name.lower() not in _HOP:
                        conn.putheader(name, value)
                conn.endheaders(body)
                reply = conn.getresponse()
                data = reply.read()
                self.send_response(reply.status, reply.reason)
                head = self.command == "HEAD"  # (its Content-Length is the object's size, with no body)
                for name, value in reply.getheaders():
                    if name.lower() not in _HOP and name.lower() != "transfer-encoding" and (
                            head or name.lower() != "content-length"):
                        self.send_header(name, value)
                if not head:
                    self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
            finally:
                conn.close()

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward  # noqa: N815 (http.server's names)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    print(server.server_address[1], flush=True)
    server.serve_forever()


class StoreProxy:
    """The proxy (a process of its own) on a free loopback port in front of ``host:port``."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.port = 0
        self._process: subprocess.Popen[str] | None = None

    def start(self) -> StoreProxy:
        self._process = subprocess.Popen(
            [sys.executable, "-m", "pgpoll.testing.store_proxy", self.target[0], str(self.target[1])],
            stdout=subprocess.PIPE, text=True, start_new_session=True)
        assert self._process.stdout is not None
        self.port = int(self._process.stdout.readline().strip())
        return self

    def _ask(self, what: str) -> dict[str, Any]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.request("GET", f"{_CONTROL}/{what}")
            return dict(json.loads(conn.getresponse().read()))
        finally:
            conn.close()

    def throttle(self, requests: int) -> None:
        """Answer the next ``requests`` requests with ``503 SlowDown`` instead of forwarding them."""
        self._ask(f"throttle?n={int(requests)}")

    @property
    def counts(self) -> Counter[str]:
        """Requests forwarded so far, by kind (``PUT``, ``GET``, ``LIST``, ``HEAD``, ``DELETE``, ``POST``)."""
        return Counter(self._ask("counts")["counts"])

    @property
    def throttled(self) -> int:
        """Requests answered with ``503 SlowDown`` so far."""
        return int(self._ask("counts")["throttled"])

    def reset(self) -> Counter[str]:
        """The counts so far, then zero."""
        return Counter(self._ask("reset")["counts"])

    @property
    def url(self) -> str:
        """The endpoint to give clients instead of the store's."""
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.wait(timeout=30)
            self._process = None


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]))
