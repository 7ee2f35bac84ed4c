"""Structured call logs: one JSON object per line for every event of every call (what the
session sent its client), and for a call's opening, closing and refusal, each with the call id,
session id, request id and door, so one call's story can be pulled out of a busy server's log
with a single filter.

Lines go to the ``duplex.calls`` logger at INFO: shown with ``--log-level info``, or written to
a file of their own with ``--call-log PATH`` (whatever the log level)."""

from __future__ import annotations

import logging
import time

import msgspec
import numpy as np

from duplex.session.realtime import events as ev

log = logging.getLogger("duplex.calls")
_encoder = msgspec.json.Encoder()


def configure(path: str | None, log_level: str) -> None:
    """Bare JSON lines (no prefix) on stderr at info level or below, and/or in ``path``."""
    log.propagate = False
    for old in list(log.handlers):
        log.removeHandler(old)
        old.close()
    formatter = logging.Formatter("%(message)s")
    handlers: list[logging.Handler] = []
    if path:
        handlers.append(logging.FileHandler(path, encoding="utf-8"))
    if logging.getLevelName(log_level.upper()) <= logging.INFO:
        handlers.append(logging.StreamHandler())
    for handler in handlers:
        handler.setFormatter(formatter)
        log.addHandler(handler)
    log.setLevel(logging.INFO if handlers else logging.WARNING)


def write(record: dict) -> None:
    log.info("%s", _encoder.encode({"ts": round(time.time(), 6), **record}).decode())


class CallLogTap:
    def __init__(self, session_id: str, door: str, call_id: str) -> None:
        self._ids = {"call_id": call_id, "session_id": session_id, "door": door}
        write({"event": "call.opened", **self._ids, "request_id": None})

    def event(self, event: ev.ServerEvent, request_id: str | None) -> None:
        if not log.isEnabledFor(logging.INFO):
            return
        data = msgspec.to_builtins(event)
        write({"event": data.pop("type"), **self._ids, "request_id": request_id, "data": data})

    def caller_audio(self, samples: np.ndarray, arrival: float) -> None:
        pass

    def agent_frame(self, pcm: np.ndarray, due: float, late_s: float, starved: bool) -> None:
        pass

    def close(self) -> None:
        write({"event": "call.closed", **self._ids, "request_id": None})


def refused(door: str, reason: str) -> None:
    write({"event": "call.refused", "door": door, "reason": reason, "call_id": None, "session_id": None,
           "request_id": None})
