"""A tiny real HTTP server that speaks just enough of the chat completions API to misbehave on
purpose (the error paths of the engine thinker), and what the engine tests share.

Each behaviour is a path prefix: base URL ``http://127.0.0.1:PORT/<mode>/v1``. Every request body
is recorded (``requests``), so tests can check the messages the thinker sent; a stream the client
closes is noticed (``disconnected`` is set)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import AsyncIterator, Iterable
from http.server import BaseHTTPRequestHandler
from typing import Any

from duplex.runtime.contract import Transcript, TurnRequest, WorkItem
from tests.fake_http import FakeHttpServer, request_body, respond

REPLY = ["Sure,", " one", " taro", " tea."]
TRANSFER_TARGET = "sip:desk@127.0.0.1:5099"


def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    body = {"id": "c1", "object": "chat.completion.chunk", "created": 0, "model": "tiny",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


class TinyEngine(FakeHttpServer):
    def __init__(self) -> None:
        super().__init__()
        self.requests: list[dict[str, Any]] = []
        self.disconnected = threading.Event()

    def on_post(self, handler: BaseHTTPRequestHandler) -> None:
        self.requests.append(json.loads(request_body(handler) or b"{}"))
        mode = handler.path.strip("/").split("/")[0]
        getattr(self, f"_{mode}")(handler)

    def url(self, mode: str) -> str:
        return f"http://127.0.0.1:{self.port}/{mode}/v1"

    # -- behaviours -------------------------------------------------------------------------------
    @staticmethod
    def _start_stream(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", "text/event-stream")
        handler.send_header("Connection", "close")
        handler.end_headers()

    def _send(self, handler: BaseHTTPRequestHandler, parts: Iterable[bytes]) -> bool:
        try:
            for part in parts:
                handler.wfile.write(part)
                handler.wfile.flush()
            return True
        except (BrokenPipeError, ConnectionResetError):
            self.disconnected.set()
            return False

    def _ok(self, handler: BaseHTTPRequestHandler) -> None:
        self._start_stream(handler)
        self._send(handler, [chunk({"role": "assistant", "content": ""}), *(chunk({"content": t}) for t in REPLY),
                             chunk({}, "stop"), b"data: [DONE]\n\n"])

    def _status(self, handler: BaseHTTPRequestHandler, code: int) -> None:
        body = json.dumps({"error": {"message": f"tiny engine says {code}", "type": "test", "code": code}}).encode()
        respond(handler, code, "application/json", body)

    def _status500(self, handler: BaseHTTPRequestHandler) -> None:
        self._status(handler, 500)

    def _status400(self, handler: BaseHTTPRequestHandler) -> None:
        self._status(handler, 400)

    def _stall(self, handler: BaseHTTPRequestHandler) -> None:
        self._start_stream(handler)
        self._send(handler, [chunk({"content": "Hello"})])
        self._release.wait(60)

    def _malformed(self, handler: BaseHTTPRequestHandler) -> None:
        self._start_stream(handler)
        self._send(handler, [chunk({"content": "Hi"}), b"data: {this is not json\n\n"])

    def _notachunk(self, handler: BaseHTTPRequestHandler) -> None:
        self._start_stream(handler)
        self._send(handler, [b'data: {"choices": [{"delta": 7}]}\n\n'])

    def _bigargs(self, handler: BaseHTTPRequestHandler) -> None:
        """A tool call whose arguments grow past 1 MB."""
        self._start_stream(handler)
        first = {"tool_calls": [{"index": 0, "id": "call_big", "type": "function",
                                 "function": {"name": "place_order", "arguments": ""}}]}
        piece = {"tool_calls": [{"index": 0, "function": {"arguments": "x" * 65536}}]}
        self._send(handler, [chunk(first), *(chunk(piece) for _ in range(17)), chunk({}, "tool_calls")])

    def _blankargs(self, handler: BaseHTTPRequestHandler) -> None:
        """A forced call that loops on line breaks, as a small model under a JSON grammar can;
        it would go on (the test's budget) if the client did not close it."""
        self._start_stream(handler)
        first = {"tool_calls": [{"index": 0, "id": "call_blank", "type": "function",
                                 "function": {"name": "place_order", "arguments": '{"drink": "taro",'}}]}
        blank = chunk({"tool_calls": [{"index": 0, "function": {"arguments": "\n "}}]})
        if not self._send(handler, [chunk(first)]):
            return
        for _ in range(6000):  # a token every 10 ms, until the client hangs up (or a minute)
            if self._release.wait(0.01) or not self._send(handler, [blank]):
                return

    def _servercall(self, handler: BaseHTTPRequestHandler) -> None:
        """A model that calls ``place_order`` and, once it has the result, says so."""
        self._start_stream(handler)
        messages = self.requests[-1].get("messages", [])
        if messages and messages[-1].get("role") == "tool":
            self._send(handler, [chunk({"content": "Order " + messages[-1]["content"] + " is in."}), chunk({}, "stop"),
                                 b"data: [DONE]\n\n"])
            return
        call = {"tool_calls": [{"index": 0, "id": "call_srv", "type": "function",
                                "function": {"name": "place_order", "arguments": '{"drink": "taro"}'}}]}
        self._send(handler, [chunk(call), chunk({}, "tool_calls"), b"data: [DONE]\n\n"])

    def _goodbye(self, handler: BaseHTTPRequestHandler) -> None:
        """A model that says goodbye and calls ``end_call`` (a call tool the server does itself)."""
        self._start_stream(handler)
        call = {"tool_calls": [{"index": 0, "id": "call_bye", "type": "function",
                                "function": {"name": "end_call", "arguments": "{}"}}]}
        self._send(handler, [chunk({"content": "Thanks for calling,"}), chunk({"content": " goodbye."}), chunk(call),
                             chunk({}, "tool_calls"), b"data: [DONE]\n\n"])

    def _transfer(self, handler: BaseHTTPRequestHandler) -> None:
        """A model that says it puts the caller through and calls ``transfer_call`` (a call tool)."""
        self._start_stream(handler)
        arguments = json.dumps({"target": TRANSFER_TARGET})
        call = {"tool_calls": [{"index": 0, "id": "call_desk", "type": "function",
                                "function": {"name": "transfer_call", "arguments": arguments}}]}
        self._send(handler, [chunk({"content": "Let me put you through"}), chunk({"content": " to the desk."}),
                             chunk(call), chunk({}, "tool_calls"), b"data: [DONE]\n\n"])

    def _orders(self, handler: BaseHTTPRequestHandler) -> None:
        """The shop's order system (a server-side tool's URL)."""
        respond(handler, 200, "text/plain", b"42")

    def _slow(self, handler: BaseHTTPRequestHandler) -> None:
        self._release.wait(60)

    def _trickle(self, handler: BaseHTTPRequestHandler) -> None:
        """Text every 20 ms until the client goes away (or 60 s)."""
        self._start_stream(handler)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not self._release.is_set():
            if not self._send(handler, [chunk({"content": " la"})]):
                return
            self._release.wait(0.02)


async def inputs_of(request: TurnRequest, text: str, request_id: str = "r1") -> AsyncIterator[WorkItem]:
    """A turn's inputs as the ASR stage sends them: an interim transcript, then the final one."""
    if text:
        yield WorkItem(request_id, "asr", Transcript(text.split()[0], final=False), False, request)
    yield WorkItem(request_id, "asr", Transcript(text, final=True), True, request)


def engine_yaml_args() -> dict[str, Any]:
    """The thinker stage's args in the bundled engine config (its persona and stop)."""
    from duplex.config import load_pipeline

    stage = next(s for s in load_pipeline("engine").stages if s.name == "thinker")
    return dict(stage.args)
