"""A real WebRTC offer from a peer that then goes away: what floods, knocks and malformed-offer
tests send (the server does its whole admission on it; nothing answers its ICE)."""

from __future__ import annotations

from aiortc import RTCPeerConnection

from duplex.edge.webrtc.rtc_options import rtc_configuration


async def offer_sdp(audio: bool = True, channel: bool = True, video: bool = False) -> str:
    pc = RTCPeerConnection(rtc_configuration([]))
    try:
        if audio:
            pc.addTransceiver("audio")
        if video:
            pc.addTransceiver("video")
        if channel:
            pc.createDataChannel("oai-events")
        await pc.setLocalDescription(await pc.createOffer())
        return pc.localDescription.sdp
    finally:
        await pc.close()
