"""The low-latency audio receive buffer: every packet out on arrival, stale ones dropped."""

from __future__ import annotations

from aiortc import RTCPeerConnection
from aiortc.jitterbuffer import JitterBuffer
from aiortc.rtp import RtpPacket

from duplex.edge.webrtc.rtc_options import ArrivalOrderAudioBuffer, receive_on_arrival, rtc_configuration


def packet(seq: int, payload: bytes) -> RtpPacket:
    p = RtpPacket(payload_type=111, sequence_number=seq, timestamp=seq * 960)
    p._data = payload  # what aiortc's receiver attaches before buffering
    return p


def test_each_packet_is_released_as_it_arrives():
    buffer = ArrivalOrderAudioBuffer(capacity=16)
    released = [buffer.add(packet(seq, bytes([seq % 256])))[1] for seq in range(100, 110)]
    assert [f.data for f in released] == [bytes([s]) for s in range(100, 110)]
    assert [f.timestamp for f in released] == [s * 960 for s in range(100, 110)]


def test_stock_buffer_holds_frames_back_which_is_the_latency_removed():
    stock = JitterBuffer(capacity=16, prefetch=4)
    out = [stock.add(packet(seq, bytes([seq])))[1] for seq in range(5)]
    assert out[:4] == [None] * 4 and out[4].data == bytes([0])  # frame 0 leaves 80 ms late


def test_late_and_duplicate_packets_are_dropped_across_the_wrap():
    buffer = ArrivalOrderAudioBuffer(capacity=16)
    order = [65534, 65535, 0, 65535, 1, 0, 2]
    out = [buffer.add(packet(seq, seq.to_bytes(2, "big")))[1] for seq in order]
    kept = [int.from_bytes(f.data, "big") for f in out if f is not None]
    assert kept == [65534, 65535, 0, 1, 2]


async def test_an_audio_receiver_gets_the_arrival_order_buffer():
    pc = RTCPeerConnection(rtc_configuration([]))
    try:
        receiver = pc.addTransceiver("audio").receiver
        assert receive_on_arrival(receiver)
        assert isinstance(receiver._RTCRtpReceiver__jitter_buffer, ArrivalOrderAudioBuffer)
    finally:
        await pc.close()
