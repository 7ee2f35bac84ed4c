"""One streamed chat completion from an OpenAI-compatible engine, with the official ``openai``
client, as a stream of typed pieces: reply text, tool-call pieces, the end.

Every way the engine can let a response down fails that response with an ``EngineError`` whose
message names the engine (base URL and model) and what happened: connection refused, an HTTP
status, a stream that stalls (no chunk for ``stall_timeout_s``), a chunk that is not a chat
completion chunk, tool-call arguments past ``max_argument_bytes`` or running on in whitespace
(``max_blank_run``: a small model under a JSON grammar may loop on line breaks to its token
budget, which on a CPU engine is minutes of silence for the caller). The client never retries
(``max_retries=0``): a caller waiting on a voice reply is better told than kept waiting twice.

Closing: the stream is closed in ``finally``, so cancelling the task that reads it (a barge-in's
abort) closes the HTTP response at once and the engine aborts the request (vLLM does on
disconnect).
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import openai

_BLANKS = re.compile(r"\s+")


class EngineError(RuntimeError):
    """A response the engine could not give; ``status`` is the HTTP status where there was one."""

    def __init__(self, engine: str, what: str, status: int | None = None) -> None:
        where = f"engine {engine}"
        super().__init__(f"{where}: HTTP {status}: {what}" if status is not None else f"{where}: {what}")
        self.status = status


@dataclass(frozen=True)
class TextPiece:
    text: str


@dataclass(frozen=True)
class CallPiece:
    """A piece of a tool call: the first for a call carries its id and name."""

    index: int
    call_id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class Finished:
    reason: str  # stop | length | tool_calls | ...


Piece = TextPiece | CallPiece | Finished


@dataclass(frozen=True)
class EngineSettings:
    base_url: str
    model: str
    api_key: str = "none"  # vLLM without --api-key accepts any; hosted endpoints read it from the env
    connect_timeout_s: float = 5.0
    stall_timeout_s: float = 10.0  # no chunk for this long (the first one included): the stream failed
    max_argument_bytes: int = 64 * 1024
    max_blank_run: int = 64  # whitespace characters in a row inside a call's arguments
    extra_body: dict[str, Any] = field(default_factory=dict)  # engine-specific request fields


class EngineClient:
    """Streams chat completions; many at once (one HTTP connection each, from one pool)."""

    def __init__(self, settings: EngineSettings) -> None:
        self.settings = settings
        self.name = f"{settings.base_url} ({settings.model})"
        # the client's own Timeout: openai 3 runs on httpx2, older releases on httpx
        timeout = openai.Timeout(connect=settings.connect_timeout_s, read=None, write=30.0, pool=30.0)
        self._client = openai.AsyncOpenAI(base_url=settings.base_url, api_key=settings.api_key,
                                          max_retries=0, timeout=timeout)

    async def stream(self, messages: list[dict[str, Any]], max_tokens: int | None,
                     tools: list[dict[str, Any]] | None = None, tool_choice: Any = None,
                     fields: dict[str, Any] | None = None) -> AsyncIterator[Piece]:
        """Yield the pieces of one completion; raises ``EngineError``."""
        request: dict[str, Any] = {"model": self.settings.model, "messages": messages, "stream": True}
        if max_tokens is not None:
            request["max_tokens"] = max_tokens
        if tools:
            request["tools"] = tools
            if tool_choice is not None:
                request["tool_choice"] = tool_choice
        body = {**self.settings.extra_body, **(fields or {})}
        stream = await self._open(request, body)
        try:
            chunks = aiter(stream)
            sizes: dict[int, int] = {}
            blanks: dict[int, int] = {}
            while True:
                chunk = await self._next(chunks)
                if chunk is None:
                    return
                for piece in self._pieces(chunk):
                    if isinstance(piece, CallPiece):
                        self._check_size(sizes, piece)
                        self._check_blanks(blanks, piece)
                    yield piece
        finally:
            await stream.close()

    async def _open(self, request: dict[str, Any], body: dict[str, Any]) -> Any:
        try:
            async with asyncio.timeout(self.settings.stall_timeout_s):  # not wait_for: see _next
                return await self._client.chat.completions.create(**request, extra_body=body or None)
        except TimeoutError:
            raise EngineError(self.name, f"no response within {self.settings.stall_timeout_s:g} s") from None
        except openai.APIStatusError as exc:
            raise EngineError(self.name, _status_message(exc), exc.status_code) from None
        except openai.APIConnectionError as exc:
            raise EngineError(self.name, f"cannot connect: {exc.__cause__ or exc}") from None

    async def _next(self, chunks: AsyncIterator[Any]) -> Any:
        try:
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for loses a cancellation (the abort)
            # that arrives as the awaited chunk does, and the stream would run on to its end
            async with asyncio.timeout(self.settings.stall_timeout_s):
                return await anext(chunks)
        except StopAsyncIteration:
            return None
        except TimeoutError:
            raise EngineError(self.name, f"stream stalled: no chunk for {self.settings.stall_timeout_s:g} s") from None
        except json.JSONDecodeError as exc:
            raise EngineError(self.name, f"malformed chunk (not JSON): {exc}") from None
        except openai.APIStatusError as exc:
            raise EngineError(self.name, _status_message(exc), exc.status_code) from None
        except openai.APIError as exc:  # an error event inside the stream, or the connection dropped
            raise EngineError(self.name, f"stream failed: {exc}") from None

    def _pieces(self, chunk: Any) -> list[Piece]:
        """A chunk's pieces; a chunk that is not a chat completion chunk fails the stream."""
        try:
            choices = chunk.choices
            if not choices:
                return []  # a usage-only chunk
            choice = choices[0]
            delta, reason = choice.delta, choice.finish_reason
            pieces: list[Piece] = []
            if delta is not None and delta.content:
                pieces.append(TextPiece(str(delta.content)))
            for call in (delta.tool_calls or []) if delta is not None else []:
                function = call.function
                pieces.append(CallPiece(int(call.index or 0), call.id or "", (function.name or "") if function else "",
                                        (function.arguments or "") if function else ""))
            if reason:
                pieces.append(Finished(str(reason)))
            return pieces
        except (AttributeError, TypeError, ValueError, IndexError) as exc:
            raise EngineError(self.name, f"malformed chunk: {exc}") from None

    def _check_size(self, sizes: dict[int, int], piece: CallPiece) -> None:
        sizes[piece.index] = sizes.get(piece.index, 0) + len(piece.arguments.encode())
        if sizes[piece.index] > self.settings.max_argument_bytes:
            raise EngineError(self.name, f"tool call arguments exceed {self.settings.max_argument_bytes} bytes")

    def _check_blanks(self, runs: dict[int, int], piece: CallPiece) -> None:
        """The longest whitespace run of a call's arguments, across pieces (``runs``: each call's
        trailing run so far)."""
        text = " " * runs.get(piece.index, 0) + piece.arguments
        runs[piece.index] = len(text) - len(text.rstrip())
        longest = max((len(run) for run in _BLANKS.findall(text)), default=0)
        if longest > self.settings.max_blank_run:
            raise EngineError(self.name, f"tool call arguments ran on in whitespace ({longest} blank characters in "
                                         f"a row, more than {self.settings.max_blank_run}): the model looped")

    async def close(self) -> None:
        await self._client.close()


def _status_message(exc: openai.APIStatusError) -> str:
    body = exc.body
    if isinstance(body, dict):
        inner = body.get("error", body)
        message = inner.get("message") if isinstance(inner, dict) else None
        if message:
            return str(message)[:500]
    return str(exc.message)[:500]


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:20]}"
