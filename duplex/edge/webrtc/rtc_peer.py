"""One aiortc peer connection and what it carries: the caller's audio out of it (decoded,
16 kHz mono), the agent's audio into it, Realtime events both ways on ``oai-events``. It runs
wherever its event loop runs: in the server process, or in a media worker (``media_worker.py``);
either way it tells a ``PeerListener`` what happened and knows nothing of sessions."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Awaitable, Callable
from typing import Protocol

import numpy as np
from aiortc import RTCDataChannel, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamTrack

from duplex.edge.config import EdgeConfig
from duplex.edge.webrtc.media import WEBRTC_OUTPUT, InputPump, SessionAudioTrack
from duplex.edge.webrtc.rtc_options import receive_on_arrival, rtc_configuration

EVENTS_CHANNEL = "oai-events"
_MAX_MESSAGE_SIZE = re.compile(r"^a=max-message-size:\d+", re.MULTILINE)


class PeerListener(Protocol):
    """What a call hears from its peer (on the event loop of whoever holds the listener)."""

    def heard(self, pcm: np.ndarray, arrival: float, position: int | None) -> None:
        """A frame of the caller's audio (int16 mono, session rate); raising fails the call."""

    def channel_opened(self) -> None: ...

    def client_message(self, message: str | bytes) -> None: ...

    def state_changed(self, state: str) -> None:
        """The connection state (aiortc's names: new, connecting, connected, failed, closed)."""

    def failed(self, reason: str) -> None:
        """The media broke inside the server: the call cannot go on."""


class Peer(Protocol):
    """A call's peer connection, local (``RtcPeer``) or in a media worker (``media_pool.RemotePeer``)."""

    low_latency: bool  # its audio receiver releases frames on arrival (see rtc_options)

    @property
    def state(self) -> str: ...

    @property
    def channel_open(self) -> bool: ...

    async def answer(self, offer_sdp: str) -> str: ...

    def send(self, text: str) -> None: ...

    async def flush(self, timeout_s: float) -> None:
        """Until what was sent has gone to the transport (at most ``timeout_s``)."""

    async def close(self) -> None: ...


class RtcPeer:
    """An aiortc peer connection in this process. ``next_pcm`` gives the agent's next 20 ms frame
    (48 kHz stereo int16) and sets the pace of the outbound track."""

    def __init__(self, config: EdgeConfig, listener: PeerListener,
                 next_pcm: Callable[[], Awaitable[np.ndarray]]) -> None:
        self._config = config
        self._listener = listener
        self._next_pcm = next_pcm
        self.pc = RTCPeerConnection(rtc_configuration(config.ice_servers))
        self.channel: RTCDataChannel | None = None
        self.low_latency = False
        self._pump: asyncio.Task | None = None

    @property
    def state(self) -> str:
        return self.pc.connectionState

    @property
    def channel_open(self) -> bool:
        return self.channel is not None and self.channel.readyState == "open"

    async def answer(self, offer_sdp: str) -> str:
        """The answer SDP to an offer ``sdp.check_offer`` passed; raises what aiortc raises for
        an offer it cannot answer."""
        pc = self.pc
        pc.on("track", self._on_track)
        pc.on("datachannel", self._on_channel)
        pc.on("connectionstatechange", lambda: self._listener.state_changed(pc.connectionState))
        await pc.setRemoteDescription(RTCSessionDescription(sdp=offer_sdp, type="offer"))
        for transceiver in pc.getTransceivers():
            if transceiver.kind == "audio" and self._config.low_latency_receive:
                self.low_latency = receive_on_arrival(transceiver.receiver) or self.low_latency
        pc.addTrack(SessionAudioTrack(self._next_pcm, WEBRTC_OUTPUT))
        await pc.setLocalDescription(await pc.createAnswer())
        # the largest data-channel message we take (aiortc advertises 256 KiB and reassembles
        # whatever arrives; a browser keeps to what the answer says)
        return _MAX_MESSAGE_SIZE.sub(f"a=max-message-size:{self._config.max_event_bytes}", pc.localDescription.sdp)

    def _on_track(self, track: MediaStreamTrack) -> None:
        if track.kind == "audio" and self._pump is None:
            pump = InputPump(track, self._listener.heard, lambda exc: self._listener.failed(repr(exc)))
            self._pump = asyncio.get_running_loop().create_task(pump.run(), name="input")

    def _on_channel(self, channel: RTCDataChannel) -> None:
        if channel.label != EVENTS_CHANNEL or self.channel is not None:
            return
        self.channel = channel
        channel.on("message", self._listener.client_message)
        if channel.readyState == "open":
            self._listener.channel_opened()
        else:
            channel.on("open", self._listener.channel_opened)

    def send(self, text: str) -> None:
        if self.channel is not None and self.channel.readyState == "open":
            self.channel.send(text)

    async def flush(self, timeout_s: float) -> None:
        channel = self.channel
        if channel is None or channel.readyState != "open" or channel.bufferedAmount == 0:
            return
        drained = asyncio.Event()
        channel.once("bufferedamountlow", drained.set)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(drained.wait(), timeout_s)

    async def close(self) -> None:
        if self._pump is not None:
            self._pump.cancel()
            await asyncio.gather(self._pump, return_exceptions=True)
        await self.pc.close()
