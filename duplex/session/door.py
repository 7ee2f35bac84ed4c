"""The seam between a door (WebRTC, the Realtime WebSocket, a phone leg, or a door of your own)
and the conversation behind it.

A door opens a session with ``SessionManager.open(door, ...)``, the one opener for every door.
What the door gives the session is the ``Door`` below: its name, the audio format it plays, where
the session's events go, and how to drop agent audio already queued at the far end. What the
door then drives is the session itself: ``push_input`` (caller audio with capture times),
``pull_output`` once per frame (the agent's audio, paced by ``pacing.FramePacer.run``), client events
through ``protocol.handle_client_message`` where the door has an event channel, and
``SessionManager.close`` at hang-up. What the conversation may ask of the call (hang up, send
keypad digits, transfer) goes through the door's ``control`` (``call_control.py``).

``clear_audio`` is a typed signal so a door without an event channel (a phone line) never reads
Realtime wire events to learn that the caller barged in."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from duplex.session.call_control import CallControl, NoCallControl
from duplex.session.playout import AudioClear, OutputFormat
from duplex.session.realtime import events as ev

__all__ = ["AudioClear", "Door", "SimpleDoor"]


class Door(Protocol):
    transport: str  # "webrtc", "websocket", "sip", "twilio", ...: how stats and metrics name calls
    output: OutputFormat  # the agent audio ``pull_output`` hands this door
    control: CallControl  # hang up, keypad digits out, transfer (or refusals naming why)

    def deliver(self, event: ev.ServerEvent) -> None:
        """An event of the session (a door without an event channel may only watch them)."""

    def clear_audio(self, why: AudioClear) -> None:
        """Agent audio queued beyond the session (a phone provider's buffer, an encoder's
        carry, a WebSocket's open audio item) must go now."""


def _keep(why: AudioClear) -> None:
    """Doors whose far end queues nothing (WebRTC pulls each frame when it is due)."""


@dataclass
class SimpleDoor:
    """A ``Door`` from plain callables, for doors that need no class of their own."""

    transport: str
    output: OutputFormat
    deliver: Callable[[ev.ServerEvent], None]
    clear_audio: Callable[[AudioClear], None] = _keep
    control: CallControl = field(default_factory=NoCallControl)
