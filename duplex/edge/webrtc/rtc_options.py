"""aiortc settings the library does not expose as options: loopback ICE candidates, the audio
receive prefetch and the outbound audio level's cost. Each is applied explicitly, in one place,
and checked at use."""

from __future__ import annotations

import logging
import math

import aioice.ice
import aiortc.rtp
import numpy as np
from aiortc import RTCConfiguration, RTCIceServer, RTCRtpReceiver
from aiortc.jitterbuffer import JitterBuffer, JitterFrame
from aiortc.rtp import RtpPacket
from aiortc.utils import uint16_gt

log = logging.getLogger("duplex.edge")
_stock_host_addresses = aioice.ice.get_host_addresses
stock_audio_level_dbov = aiortc.rtp.compute_audio_level_dbov  # aiortc's own, kept for comparison


def rtc_configuration(ice_servers: list[str]) -> RTCConfiguration:
    """No public STUN server unless configured (aiortc adds Google's when given none)."""
    return RTCConfiguration(iceServers=[RTCIceServer(urls=url) for url in ice_servers])


def use_loopback_candidates(enabled: bool) -> None:
    """Gather ICE host candidates on 127.0.0.1 only (tests, single-host setups).

    aioice skips loopback when it lists local addresses and has no option to include it, so
    this swaps its address lister for the process. Off restores the stock lister."""
    if enabled:
        aioice.ice.get_host_addresses = _loopback_addresses
    else:
        aioice.ice.get_host_addresses = _stock_host_addresses


def _loopback_addresses(use_ipv4: bool, use_ipv6: bool) -> list[str]:
    return ["127.0.0.1"] if use_ipv4 else ["::1"]


def use_vectorised_audio_level() -> None:
    """aiortc's sender computes every outbound audio frame's RFC 6465 level (the RTP audio-level
    header) with a Python loop over its samples, on the event loop: ~0.25 ms per frame, 40 % of
    a core at 32 calls. This swaps in the same formula on numpy, for the process."""
    aiortc.rtp.compute_audio_level_dbov = audio_level_dbov


def audio_level_dbov(frame) -> int:
    """aiortc's ``compute_audio_level_dbov``, vectorised: the same value for every frame (its sum
    runs over the whole first plane, all channels, divided by the per-channel sample count)."""
    samples = np.frombuffer(frame.planes[0], dtype=np.int16).astype(np.float64)
    rms = math.sqrt(float(np.dot(samples, samples)) / (frame.samples * 32767.0 * 32767.0))
    if rms <= 0:
        return -127
    return round(min(0.0, max(-127.0, 20 * math.log10(rms))))


class ArrivalOrderAudioBuffer(JitterBuffer):
    """Hands each audio packet to the decoder the moment it arrives.

    Every Opus RTP packet carries one whole frame, so nothing is gained by waiting: aiortc's
    stock audio buffer holds 4 further frames (~80 ms) and even with no prefetch it releases
    a frame only when the next one shows up (20 ms). Packets arriving after a newer one are
    dropped (their moment has passed); loss concealment is the decoder's business."""

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity=capacity, prefetch=0)
        self._newest: int | None = None

    def add(self, packet: RtpPacket) -> tuple[bool, JitterFrame | None]:
        payload = getattr(packet, "_data", None)  # the depayloaded frame, which aiortc's receiver attaches
        if payload is None:
            return super().add(packet)
        if self._newest is not None and not uint16_gt(packet.sequence_number, self._newest):
            return False, None  # a duplicate, or overtaken by a newer packet
        self._newest = packet.sequence_number
        return False, JitterFrame(data=payload, timestamp=packet.timestamp)


def receive_on_arrival(receiver: RTCRtpReceiver) -> bool:
    """Make an audio receiver release each frame on arrival (see ArrivalOrderAudioBuffer).

    A barge-in budget of 200 ms cannot afford the stock buffer's 80-100 ms. aiortc builds the
    buffer privately, so we replace it before media flows (after setRemoteDescription). Returns
    False, and leaves the stock buffer, if aiortc's internals changed."""
    attribute = "_RTCRtpReceiver__jitter_buffer"
    stock = getattr(receiver, attribute, None)
    if not isinstance(stock, JitterBuffer):
        log.warning("aiortc internals changed: the audio receive buffer stays at its default")
        return False
    setattr(receiver, attribute, ArrivalOrderAudioBuffer(capacity=stock.capacity))
    return True
