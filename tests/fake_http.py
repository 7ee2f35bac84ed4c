"""The one small base of the tests' fake HTTP servers (a chat-completions engine, speech
endpoints): a real HTTP/1.1 server on a loopback port, in a thread, each connection counted while
it is open (``open_connections``) so tests can check that clients close what they open. A
subclass answers in ``on_post`` / ``on_get``; ``_release`` ends its stalls at shutdown."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Self


class FakeHttpServer:
    def __init__(self) -> None:
        self._release = threading.Event()
        self._lock = threading.Lock()
        self._open = 0
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def setup(self) -> None:
                super().setup()
                with fake._lock:
                    fake._open += 1

            def finish(self) -> None:
                try:
                    super().finish()
                finally:
                    with fake._lock:
                        fake._open -= 1

            def do_GET(self) -> None:
                fake.on_get(self)

            def do_POST(self) -> None:
                fake.on_post(self)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def on_get(self, handler: BaseHTTPRequestHandler) -> None:
        respond(handler, 404, "application/json", b'{"detail": "Not Found"}')

    def on_post(self, handler: BaseHTTPRequestHandler) -> None:
        raise NotImplementedError

    @property
    def open_connections(self) -> int:
        with self._lock:
            return self._open

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._release.set()
        self._server.shutdown()
        self._server.server_close()


def request_body(handler: BaseHTTPRequestHandler) -> bytes:
    return handler.rfile.read(int(handler.headers.get("Content-Length", 0)))


def head(handler: BaseHTTPRequestHandler, status: int, kind: str, length: int) -> None:
    handler.send_response(status)
    handler.send_header("Content-Type", kind)
    handler.send_header("Content-Length", str(length))
    handler.end_headers()


def respond(handler: BaseHTTPRequestHandler, status: int, kind: str, body: bytes) -> None:
    head(handler, status, kind, len(body))
    handler.wfile.write(body)
