"""A scripted OpenAI-style chat completions server on 127.0.0.1 (a thread of the test
process), shared by the HTTP summariser tests and the compaction tests that run it
through ``vakpipe compact --summariser http``.

The n-th request gets the n-th scripted :class:`Reply` (the last one repeats); every
request is recorded, so retries are counted, not inferred. Worker processes of a Dask
cluster reach it over real HTTP like any endpoint.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Reply:
    status: int = 200
    body: bytes | None = None  # None: a chat completion holding ``text``
    text: str = "Turns t1-t2: checked both services; healthy [ev:call_1]."
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    finish_reason: str = "stop"

    def payload(self) -> bytes:
        if self.body is not None:
            return self.body
        return json.dumps({"id": "cmpl-1", "object": "chat.completion", "choices": [
            {"index": 0, "message": {"role": "assistant", "content": self.text},
             "finish_reason": self.finish_reason}]}).encode()


@dataclass
class Seen:
    at: float
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that gave up (timeout test) leaves the handler writing to a closed
        # socket: expected, not worth a traceback on stderr.
        pass


class Server:
    """A scripted chat completions server: the n-th request gets the n-th reply (the
    last one repeats)."""

    def __init__(self) -> None:
        self.replies: list[Reply] = [Reply()]
        self.seen: list[Seen] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(length))
                server.seen.append(Seen(time.monotonic(), self.path, dict(self.headers), body))
                reply = server.replies[min(len(server.seen), len(server.replies)) - 1]
                time.sleep(reply.delay)
                data = reply.payload()
                self.send_response(reply.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in reply.headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.httpd = _QuietServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True,
                                       kwargs={"poll_interval": 0.02})
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
