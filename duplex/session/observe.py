"""What a server watches of its calls, as seen from the session: a ``CallObserver`` (one per
server: metrics, logs, recording; the server room plugs one in) opens a ``CallTap`` per call, and
the session and its manager hand the tap every event sent to the client, the caller's audio as it
arrived and every output frame as it went to the transport. Protocols only: this layer knows
nothing of Prometheus, files or log formats. With no observer the tap is ``NO_TAP``, which does
nothing (``--no-metrics``)."""

from __future__ import annotations

import enum
from typing import NamedTuple, Protocol

import numpy as np

from duplex.session.playout import OutputFormat, PulledFrame
from duplex.session.realtime import events as ev
from duplex.session.recording import NOT_RECORDED, Opening, RecordingSwitch
from duplex.session.response import Response
from duplex.session.states import ResponseState


class Refusal(str, enum.Enum):
    """Why a new call was refused."""

    FULL = "full"  # every session slot in use
    DRAINING = "draining"  # the server is stopping (SIGTERM): live calls finish, no new ones
    BAD_REQUEST = "bad_request"  # the offer or its settings could not be used
    OVERLOADED = "overloaded"  # taking it would push turn latency past the budget (admission by load)
    STAGE_DOWN = "stage_down"  # a stage of the pipeline is down: the call could not be served
    MEDIA_DOWN = "media_down"  # no media worker could carry the call (one died or is starting again)
    RATE_LIMITED = "rate_limited"  # its source, or everyone, started too many calls lately
    PENDING_CAPPED = "pending_capped"  # its source already holds its share of calls not yet connected
    # (a request without the API key never reaches a door: the edge's access check counts it,
    # ``duplex_auth_refused_total``)


class CallTap(Protocol):
    def event(self, event: ev.ServerEvent, request_id: str | None) -> None:
        """An event as it goes to the client; ``request_id``: the runtime request of the
        session's latest response, if any."""

    def caller_audio(self, samples: np.ndarray, arrival: float) -> None:
        """Caller audio, int16 mono at the session rate, as it arrived (monotonic seconds)."""

    def agent_frame(self, pcm: np.ndarray, due: float, late_s: float, starved: bool) -> None:
        """One output frame (int16 interleaved, the call's output format) handed out for ``due``,
        ``late_s`` after it was due; ``starved``: a reply was playing but had no audio ready."""

    def close(self) -> None: ...


class CallWatch(NamedTuple):
    """What the observer keeps of one call: its tap, and its recording's switch."""

    tap: CallTap
    recording: RecordingSwitch = NOT_RECORDED


class CallObserver(Protocol):
    def open_call(self, session_id: str, door: str, call_id: str, output_format: OutputFormat,
                  opening: Opening) -> CallWatch: ...
    def refused(self, door: str, reason: Refusal) -> None: ...


class _NoTap:
    def event(self, event: ev.ServerEvent, request_id: str | None) -> None:
        pass

    def caller_audio(self, samples: np.ndarray, arrival: float) -> None:
        pass

    def agent_frame(self, pcm: np.ndarray, due: float, late_s: float, starved: bool) -> None:
        pass

    def close(self) -> None:
        pass


NO_TAP: CallTap = _NoTap()

# a paused reply's silence counted as an underrun before pausing was a state of its own (it was
# ``speaking`` then): kept so the metric reads as it did
_UNDERRUN_STATES = frozenset({ResponseState.SPEAKING, ResponseState.PAUSED})


def starved(response: Response | None, frame: PulledFrame) -> bool:
    """A reply is playing (its audio began, the pipeline still makes more) but this frame is
    silence: the pipeline fell behind real time (an underrun the caller hears as a gap)."""
    return response is not None and response.state in _UNDERRUN_STATES and frame.item_id is None
