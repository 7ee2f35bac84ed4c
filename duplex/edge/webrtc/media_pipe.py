"""The pipe between the server and one media worker: msgspec messages, each prefixed with its
length, over a Unix stream socket, read and written by the two event loops themselves.

Not ZeroMQ, on purpose: audio crosses this pipe 50 times a second per call each way, and a
ZeroMQ message wakes a sender I/O thread and a receiver I/O thread on top of both loops (with
8 calls on two workers, ~0.15 cores of wake-ups on a 2-core box). Here a message is one write
on one side and, often batched with others, one read on the other."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import msgspec

log = logging.getLogger("duplex.edge.media")
HEADER = 4  # bytes of big-endian length before each message
MAX_MESSAGE = 1 << 20  # the largest: an SDP offer or answer, a 64 KiB event; more is a broken pipe
MAX_BUFFERED = 8 << 20  # unsent bytes past which a stuck reader's messages are dropped (and counted)


class FramedPipe(asyncio.Protocol):
    """One end of the pipe. ``on_message`` gets each decoded message; ``on_lost`` the end."""

    def __init__(self, decoder: msgspec.msgpack.Decoder, on_message: Callable[[Any], None],
                 on_lost: Callable[[], None]) -> None:
        self._decoder = decoder
        self._on_message = on_message
        self._on_lost = on_lost
        self._encoder = msgspec.msgpack.Encoder()
        self._buffer = bytearray()
        self._transport: asyncio.Transport | None = None
        self.connected = asyncio.get_running_loop().create_future()
        self.dropped = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        if not self.connected.done():
            self.connected.set_result(None)

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        start = 0
        while len(buffer) - start >= HEADER:
            size = int.from_bytes(buffer[start:start + HEADER], "big")
            if size > MAX_MESSAGE:
                log.error("a media pipe message claims %d bytes; closing the pipe", size)
                self.close()
                return
            end = start + HEADER + size
            if len(buffer) < end:
                break
            message = self._decoder.decode(buffer[start + HEADER:end])
            start = end
            try:
                self._on_message(message)
            except Exception:  # one call's trouble; the pipe serves the worker's other calls
                log.exception("handling %s", type(message).__name__)
        del buffer[:start]

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self._on_lost()

    def send(self, message: msgspec.Struct) -> None:
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        if transport.get_write_buffer_size() > MAX_BUFFERED:
            self.dropped += 1
            return
        payload = self._encoder.encode(message)
        transport.write(len(payload).to_bytes(HEADER, "big") + payload)

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()
