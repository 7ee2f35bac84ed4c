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
from http.server import BaseHTTPRequestHandler

from tests.fake_http import FakeHttpServer, head, request_body, respond

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


class FakeTranscriptions(FakeHttpServer):
    """An OpenAI-compatible ``/v1/audio/transcriptions`` that misbehaves: ``stall`` (never
    answers), ``garbage`` (200 with a body that is no transcription), ``status500`` (an error
    with a message); or ``json_only``, that refuses ``verbose_json`` as OpenAI's newer models do
    and answers ``json`` with ``TEXT``. The response formats asked for are kept (``formats``)."""

    TEXT = "Hello there."

    def __init__(self, mode: str) -> None:
        super().__init__()
        self.mode = mode
        self.formats: list[str] = []
        self.url = f"http://127.0.0.1:{self.port}/v1"

    def on_post(self, handler: BaseHTTPRequestHandler) -> None:
        body = request_body(handler)
        verbose = b'name="response_format"\r\n\r\nverbose_json' in body
        self.formats.append("verbose_json" if verbose else "json")
        if self.mode == "json_only":
            if verbose:
                respond(handler, 400, "application/json", b'{"error": {"message": "response_format '
                        b'\'verbose_json\' is not compatible with this model, use json or text"}}')
            else:
                respond(handler, 200, "application/json", json.dumps({"text": self.TEXT}).encode())
        elif self.mode == "stall":
            self._release.wait(60)
        elif self.mode == "garbage":
            respond(handler, 200, "text/html", b"<html>not json</html>")
        else:
            respond(handler, 500, "application/json", b'{"error": {"message": "the fake is broken"}}')


class FakeSpeech(FakeHttpServer):
    """An OpenAI-compatible ``/v1/audio/speech`` that misbehaves: ``stall`` (sends the headers and
    a little audio, then nothing), ``garbage`` (200 with a web page), ``notwav`` (an audio type
    whose body is no WAV), ``rate`` (a WAV at 1 MHz), ``hangup`` (promises more audio than it
    sends, then closes the connection), ``status500`` (an error with a message); ``voices``
    lists two voices at ``GET /v1/audio/voices`` (as Kokoro-FastAPI does) and answers with a
    little audio. Each connection is counted while it is open (``open_connections``)."""

    def __init__(self, mode: str) -> None:
        super().__init__()
        self.mode = mode
        self.requests: list[dict] = []
        self.url = f"http://127.0.0.1:{self.port}/v1"

    def on_get(self, handler: BaseHTTPRequestHandler) -> None:
        if self.mode == "voices" and handler.path == "/v1/audio/voices":
            respond(handler, 200, "application/json", b'{"voices": ["af_bella", "am_adam"]}')
        else:
            super().on_get(handler)

    def on_post(self, handler: BaseHTTPRequestHandler) -> None:
        with self._lock:
            self.requests.append(json.loads(request_body(handler)))
        pcm = b"\x00\x10" * 2400  # 0.1 s at 24 kHz
        if self.mode in ("stall", "hangup"):
            head(handler, 200, "audio/pcm", len(pcm) * 10)
            handler.wfile.write(pcm)
            if self.mode == "hangup":
                handler.close_connection = True
                return
            handler.wfile.flush()
            while not self._release.is_set() and handler.rfile.read(1):  # until the client hangs up
                pass
        elif self.mode == "voices":
            respond(handler, 200, "audio/pcm", pcm)
        elif self.mode == "garbage":
            respond(handler, 200, "text/html", b"<html>not audio</html>")
        elif self.mode == "notwav":
            respond(handler, 200, "audio/wav", b"this is not a wav file at all")
        elif self.mode == "rate":
            fmt = struct.pack("<HHIIHH", 1, 1, 1_000_000, 2_000_000, 2, 16)
            respond(handler, 200, "audio/wav", b"RIFF\xff\xff\xff\xffWAVEfmt " + struct.pack("<I", 16) + fmt
                    + b"data\xff\xff\xff\xff" + pcm)
        else:
            respond(handler, 500, "application/json", b'{"error": {"message": "the fake is broken"}}')
