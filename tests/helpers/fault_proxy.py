"""A fault-injecting HTTP proxy in front of moto's S3 server, for the reliability tests.

Everything s3fs (in the test process, in Dask workers, in a ``vakpipe`` subprocess) sends
to the proxy's endpoint is forwarded to moto unchanged, except where a :class:`Rule`
says otherwise: answer ``503 SlowDown`` or ``503 ServiceUnavailable``, ``403
AccessDenied``, reset the connection (an RST, no response), delay the request, or run a
callback before forwarding it (to replace an object between two requests of a read).
Each rule fires a bounded number of times per key, so "N failures, then success" and
"fails forever" are both real sequences of HTTP exchanges.

Every request is logged (method, bucket, key, query, copy source, the keys of a batch
delete), so a test can count retries or prove what was never sent.

Path-style addressing only (what an ``endpoint_url`` on 127.0.0.1 gets from botocore).
"""

from __future__ import annotations

import http.client
import re
import socket
import struct
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

#: Request methods that only read.
READ_METHODS = frozenset({"GET", "HEAD"})
#: Headers that describe one hop, never forwarded as they are.
_HOP = frozenset({"connection", "keep-alive", "transfer-encoding", "content-length",
                  "proxy-connection", "te", "trailer", "upgrade"})


@dataclass(frozen=True)
class Request:
    """One request the proxy received."""

    method: str
    bucket: str
    key: str
    query: str
    #: ``x-amz-copy-source`` (a server-side copy reads that key, writes ``key``).
    copy_source: str | None = None
    #: Keys named in the body of a batch delete (``POST ?delete``).
    deleted: tuple[str, ...] = ()
    #: What the proxy did: ``forward`` or the name of the fault injected.
    action: str = "forward"
    #: The client's end of the connection (address, port): which process asked.
    peer: tuple[str, int] = ("", 0)

    @property
    def writes(self) -> tuple[str, ...]:
        """Keys this request would create, change or delete (empty for reads)."""
        if self.method in READ_METHODS:
            return ()
        if self.key:
            return (self.key, *self.deleted)
        # A batch delete names its keys in the body; any other write without a key is
        # one on the bucket itself (create, delete, configure).
        return self.deleted if self.deleted else (f"<bucket {self.bucket}>",)


@dataclass
class Rule:
    """A fault for requests matching ``method`` (``None``: any) and ``key`` (a regular
    expression searched in the key), at most ``times`` times per key (``None``: always),
    once ``after`` matching requests of that key went through untouched.

    ``action`` is one of ``slowdown``, ``unavailable``, ``denied``, ``reset``, ``delay``
    (``seconds``, then forwarded) or ``call`` (``callback(key)`` runs, then the request
    is forwarded).
    """

    action: str
    key: str
    method: str | None = None
    times: int | None = 1
    after: int = 0
    seconds: float = 0.0
    callback: Callable[[str], None] | None = None
    fired: Counter[str] = field(default_factory=Counter)
    seen: Counter[str] = field(default_factory=Counter)

    def take(self, method: str, key: str) -> bool:
        """Whether this rule fires for this request (and count it)."""
        if self.method is not None and method != self.method:
            return False
        if not key or not re.search(self.key, key):
            return False
        self.seen[key] += 1
        if self.seen[key] <= self.after:
            return False
        if self.times is not None and self.fired[key] >= self.times:
            return False
        self.fired[key] += 1
        return True


_ERRORS = {
    "slowdown": (503, "SlowDown", "Please reduce your request rate."),
    "unavailable": (503, "ServiceUnavailable", "Service is unable to handle request."),
    "denied": (403, "AccessDenied", "Access Denied"),
}


class FaultProxy:
    """The proxy: start with :func:`fault_proxy`; add rules, read the log."""

    def __init__(self, upstream: str) -> None:
        parsed = urllib.parse.urlsplit(upstream)
        self.upstream = (parsed.hostname or "127.0.0.1", parsed.port or 80)
        self.rules: list[Rule] = []
        self.log: list[Request] = []
        self._lock = threading.Lock()
        self.endpoint = ""

    def add(self, rule: Rule) -> Rule:
        """Add a rule (rules are tried in the order added; the first that fires wins)."""
        with self._lock:
            self.rules.append(rule)
        return rule

    def clear(self) -> None:
        """Drop every rule and the log."""
        with self._lock:
            self.rules.clear()
            self.log.clear()

    def requests(self, key: str | None = None, method: str | None = None) -> list[Request]:
        """The logged requests, of ``key`` (exact) and ``method`` when given."""
        with self._lock:
            return [r for r in self.log if (key is None or r.key == key)
                    and (method is None or r.method == method)]

    def _decide(self, method: str, key: str) -> Rule | None:
        with self._lock:
            for rule in self.rules:
                if rule.take(method, key):
                    return rule
        return None

    def _record(self, request: Request) -> None:
        with self._lock:
            self.log.append(request)


class InFlight:
    """A ``call`` rule's callback that holds each request ``seconds`` and counts those
    held at once: :attr:`most` > 1 proves requests went side by side."""

    def __init__(self, seconds: float = 0.05) -> None:
        self.seconds = seconds
        self.now = 0
        self.most = 0
        self._lock = threading.Lock()

    def __call__(self, key: str) -> None:
        with self._lock:
            self.now += 1
            self.most = max(self.most, self.now)
        time.sleep(self.seconds)
        with self._lock:
            self.now -= 1


def _error_body(code: str, message: str, key: str) -> bytes:
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
            f"<Message>{message}</Message><Key>{key}</Key>"
            "<RequestId>fault-proxy</RequestId></Error>").encode()


def _read_body(handler: BaseHTTPRequestHandler) -> bytes:
    if "chunked" in handler.headers.get("Transfer-Encoding", "").lower():
        body = b""
        while True:
            size = int(handler.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while handler.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return body
            body += handler.rfile.read(size)
            handler.rfile.readline()
    length = int(handler.headers.get("Content-Length") or 0)
    return handler.rfile.read(length) if length else b""


def _handler(proxy: FaultProxy) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as aiohttp expects
        # The headers and the body are two writes: with Nagle's algorithm the second
        # waits for the client's delayed ACK of the first, ~40 ms a request.
        disable_nagle_algorithm = True

        def log_message(self, format: str, *args: object) -> None:
            pass

        def _serve(self) -> None:
            method = self.command
            split = urllib.parse.urlsplit(self.path)
            bucket, _, key = urllib.parse.unquote(split.path).lstrip("/").partition("/")
            body = _read_body(self)
            deleted: tuple[str, ...] = ()
            if method == "POST" and "delete" in urllib.parse.parse_qs(
                    split.query, keep_blank_values=True):
                deleted = tuple(urllib.parse.unquote(k) for k in
                                re.findall(r"<Key>(.*?)</Key>", body.decode("utf-8",
                                                                            "replace")))
            rule = proxy._decide(method, key)
            action = rule.action if rule is not None else "forward"
            proxy._record(Request(method, bucket, key, split.query,
                                  self.headers.get("x-amz-copy-source"), deleted, action,
                                  (self.client_address[0], self.client_address[1])))
            if rule is not None and rule.action == "reset":
                # SO_LINGER 0: close() sends an RST, as a dropped connection does.
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                           struct.pack("ii", 1, 0))
                self.close_connection = True
                self.connection.close()
                return
            if rule is not None and rule.action in _ERRORS:
                status, code, message = _ERRORS[rule.action]
                payload = b"" if method == "HEAD" else _error_body(code, message, key)
                self.send_response(status)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
                return
            if rule is not None and rule.action == "delay":
                time.sleep(rule.seconds)
            if rule is not None and rule.action == "call" and rule.callback is not None:
                rule.callback(key)
            self._forward(method, body)

        def _forward(self, method: str, body: bytes) -> None:
            conn = http.client.HTTPConnection(*proxy.upstream, timeout=60)
            try:
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
                if body or method in ("PUT", "POST"):
                    headers["Content-Length"] = str(len(body))
                conn.request(method, self.path, body=body or None, headers=headers)
                resp = conn.getresponse()
                payload = resp.read()
                self.send_response(resp.status, resp.reason)
                for k, v in resp.getheaders():
                    if k.lower() not in _HOP:
                        self.send_header(k, v)
                length = resp.getheader("Content-Length")
                # A HEAD answer keeps the object's length; it has no body.
                self.send_header("Content-Length",
                                 length if method == "HEAD" and length else str(len(payload)))
                self.end_headers()
                if method != "HEAD":
                    self.wfile.write(payload)
            finally:
                conn.close()

        do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _serve

    return Handler


@contextmanager
def fault_proxy(upstream: str) -> Iterator[FaultProxy]:
    """Run a :class:`FaultProxy` to ``upstream`` on 127.0.0.1 (a free port) for the block."""
    proxy = FaultProxy(upstream)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(proxy))
    server.daemon_threads = True
    proxy.endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, name="fault-proxy", daemon=True)
    thread.start()
    try:
        yield proxy
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
