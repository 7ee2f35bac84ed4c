"""Tiny real servers that misbehave on purpose (the error paths of the ``speech`` stages): a TCP
server that speaks just enough Wyoming, each accepted connection getting the ``mode``'s answer
(every connection it accepted is counted and noticed when the client closes it:
``open_connections``, so tests can check that nothing is left open); and HTTP servers in place
of an OpenAI-compatible ``/v1/audio/transcriptions`` and ``/v1/audio/speech``."""

from __future__ import annotations

import json
import socket
import struct
import threading

_AUDIO_START = {"type": "audio-start", "data": {"rate": 22050, "width": 2, "channels": 1}}


def _event(kind: str, data: dict | None = None, payload: bytes = b"") -> bytes:
    header: dict = {"type": kind, "version": "1.0.0"}
    body = json.dumps(data).encode() if data else b""
    if body:
        header["data_length"] = len(body)
    if payload:
        header["payload_length"] = len(payload)
    return json.dumps(header).encode() + b"\n" + body + payload


class FakeWyoming:
    """Modes: ``stall`` (reads, never answers), ``garbage`` (answers with bytes that are no event),
    ``rate`` (audio at 1 MHz), ``hangup`` (closes the connection after the first line)."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self.url = f"tcp://127.0.0.1:{self.port}"
        self.accepted = 0
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    @property
    def open_connections(self) -> int:
        with self._lock:
            return len(self._open)

    def __enter__(self) -> FakeWyoming:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._sock.close()
        with self._lock:
            for conn in self._open:
                conn.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with self._lock:
                self.accepted += 1
                self._open.add(conn)
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        try:
            reader = conn.makefile("rb")
            reader.readline()  # the first event's header (describe, transcribe, synthesize)
            if self.mode == "garbage":
                conn.sendall(b"\x00\xffthis is not json at all\n")
            elif self.mode == "rate":
                pcm = b"\x00\x01" * 512
                conn.sendall(_event("audio-start", {"rate": 1_000_000, "width": 2, "channels": 1})
                             + _event("audio-chunk", {"rate": 1_000_000, "width": 2, "channels": 1}, pcm))
            elif self.mode == "hangup":
                return
            while reader.read(4096):  # stall (and the others): take what comes until the client hangs up
                pass
        except OSError:
            pass
        finally:
            with self._lock:
                self._open.discard(conn)
            conn.close()


class FakeTranscriptions:
    """An OpenAI-compatible ``/v1/audio/transcriptions`` that misbehaves: ``stall`` (never
    answers), ``garbage`` (200 with a body that is no transcription), ``status500`` (an error
    with a message)."""

    def __init__(self, mode: str) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        fake = self
        self.mode = mode
        self._release = threading.Event()

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if fake.mode == "stall":
                    fake._release.wait(60)
                    return
                status, body = (200, b"<html>not json</html>") if fake.mode == "garbage" else \
                    (500, b'{"error": {"message": "the fake is broken"}}')
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/v1"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> FakeTranscriptions:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._release.set()
        self._server.shutdown()
        self._server.server_close()


class FakeSpeech:
    """An OpenAI-compatible ``/v1/audio/speech`` that misbehaves: ``stall`` (sends the headers and
    a little audio, then nothing), ``garbage`` (200 with a web page), ``notwav`` (an audio type
    whose body is no WAV), ``rate`` (a WAV at 1 MHz), ``hangup`` (promises more audio than it
    sends, then closes the connection), ``status500`` (an error with a message); ``voices``
    lists two voices at ``GET /v1/audio/voices`` (as Kokoro-FastAPI does) and answers with a
    little audio. Each connection is counted while it is open (``open_connections``)."""

    def __init__(self, mode: str) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        fake = self
        self.mode = mode
        self.requests: list[dict] = []
        self._release = threading.Event()
        self._lock = threading.Lock()
        self._open = 0

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
                if fake.mode == "voices" and self.path == "/v1/audio/voices":
                    self._send(200, "application/json", b'{"voices": ["af_bella", "am_adam"]}')
                else:
                    self._send(404, "application/json", b'{"detail": "Not Found"}')

            def do_POST(self) -> None:
                with fake._lock:
                    fake.requests.append(json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0)))))
                pcm = b"\x00\x10" * 2400  # 0.1 s at 24 kHz
                if fake.mode == "stall":
                    self._head(200, "audio/pcm", len(pcm) * 10)
                    self.wfile.write(pcm)
                    self.wfile.flush()
                    while not fake._release.is_set() and self.rfile.read(1):  # until the client hangs up
                        pass
                elif fake.mode == "hangup":
                    self._head(200, "audio/pcm", len(pcm) * 10)
                    self.wfile.write(pcm)
                    self.close_connection = True
                elif fake.mode == "voices":
                    self._send(200, "audio/pcm", pcm)
                elif fake.mode == "garbage":
                    self._send(200, "text/html", b"<html>not audio</html>")
                elif fake.mode == "notwav":
                    self._send(200, "audio/wav", b"this is not a wav file at all")
                elif fake.mode == "rate":
                    fmt = struct.pack("<HHIIHH", 1, 1, 1_000_000, 2_000_000, 2, 16)
                    self._send(200, "audio/wav", b"RIFF\xff\xff\xff\xffWAVEfmt " + struct.pack("<I", 16) + fmt
                               + b"data\xff\xff\xff\xff" + pcm)
                else:
                    self._send(500, "application/json", b'{"error": {"message": "the fake is broken"}}')

            def _head(self, status: int, kind: str, length: int) -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(length))
                self.end_headers()

            def _send(self, status: int, kind: str, body: bytes) -> None:
                self._head(status, kind, len(body))
                self.wfile.write(body)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/v1"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def open_connections(self) -> int:
        with self._lock:
            return self._open

    def __enter__(self) -> FakeSpeech:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._release.set()
        self._server.shutdown()
        self._server.server_close()
