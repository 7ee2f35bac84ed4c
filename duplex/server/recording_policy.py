"""Which calls are recorded (``--record-policy``), and each call's recording as a switch the
session asks (``session/recording.py``): ``all`` records every call, ``share`` a fraction of
calls drawn at random per call (``--record-share``), ``on_request`` the calls whose client asks
(``session.update`` ``recording: true``, at open or later: the recording starts then), ``none``
none. A recording the policy requires (``all``, or drawn by ``share``) cannot be turned off by
the client; one it asked for can, and is then paused: its files keep the timeline, silent while
paused, and no events."""

from __future__ import annotations

import enum
import logging
import random
from collections.abc import Callable

import numpy as np

from duplex.server.recording import CallRecording, Recorder
from duplex.session.playout import OutputFormat
from duplex.session.realtime import events as ev
from duplex.session.recording import RecordingRefused

log = logging.getLogger("duplex.recording")
DEFAULT_NOTICE = "This call is recorded."


class RecordingPolicy(str, enum.Enum):
    NONE = "none"
    ALL = "all"
    SHARE = "share"
    ON_REQUEST = "on_request"


class CallRecorder:
    """One call's recording: a ``CallTap`` that writes while on, and the session's
    ``RecordingSwitch``. The files are made when the recording first starts."""

    def __init__(self, recorder: Recorder, call_id: str, output_format: OutputFormat, owner: str | None,
                 policy: RecordingPolicy, required: bool, notice: str) -> None:
        self._recorder = recorder
        self._call_id, self._format, self._owner = call_id, output_format, owner
        self._policy = policy
        self._required = required
        self.notice = notice
        self._recording: CallRecording | None = None
        self._on = False
        if required:
            self._start()

    @property
    def active(self) -> bool:
        return self._on

    def ask(self, on: bool) -> None:
        if on == self._on:
            return
        if not on and self._required:
            why = ("this server records every call (recording policy all)" if self._policy is RecordingPolicy.ALL
                   else "this call was chosen to be recorded (recording policy share)")
            raise RecordingRefused("recording_required", f"the recording cannot be turned off: {why}")
        if on and self._policy is not RecordingPolicy.ON_REQUEST:
            raise RecordingRefused("recording_unavailable", "this server does not record calls on request "
                                                            f"(recording policy {self._policy.value})")
        if on:
            self._start()
        else:
            self._on = False

    def _start(self) -> None:
        if self._recording is None:
            try:
                self._recording = self._recorder.open_call(self._call_id, self._format, self._owner,
                                                           "on_request" if not self._required else self._policy.value)
            except OSError as exc:  # an unwritable folder loses the recording, not the call
                log.error("cannot record call %s: %s", self._call_id, exc)
                return
        self._on = True

    # -- CallTap --------------------------------------------------------------------------------
    def event(self, event: ev.ServerEvent, request_id: str | None) -> None:
        if self._on and self._recording is not None:
            self._recording.event(event, request_id)

    def caller_audio(self, samples: np.ndarray, arrival: float) -> None:
        if self._on and self._recording is not None:
            self._recording.caller_audio(samples, arrival)

    def agent_frame(self, pcm: np.ndarray, due: float, late_s: float, starved: bool) -> None:
        if self._on and self._recording is not None:
            self._recording.agent_frame(pcm, due, late_s, starved)

    def close(self) -> None:
        self._on = False
        if self._recording is not None:
            self._recording.close()


class RecordingDesk:
    """The server's recorder under its policy: one ``CallRecorder`` per call."""

    def __init__(self, recorder: Recorder, policy: RecordingPolicy, share: float = 1.0,
                 notice: str = DEFAULT_NOTICE, draw: Callable[[], float] = random.random) -> None:
        self.recorder = recorder
        self.policy = policy
        self.share = share
        self.notice = notice
        self._draw = draw

    def open_call(self, call_id: str, output_format: OutputFormat, owner: str | None) -> CallRecorder:
        required = self.policy is RecordingPolicy.ALL or (self.policy is RecordingPolicy.SHARE
                                                          and self._draw() < self.share)
        return CallRecorder(self.recorder, call_id, output_format, owner, self.policy, required, self.notice)
