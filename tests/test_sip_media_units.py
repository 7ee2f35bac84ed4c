"""G.711, rate conversion, RTP packets, the packetizer and the jitter buffer."""

from __future__ import annotations

import av
import numpy as np
import pytest

from duplex.audio import Resampler
from duplex.edge.media import g711
from duplex.edge.media.audio import PHONE_FRAME, PhoneDecoder, PhoneEncoder
from duplex.edge.media.jitter import JitterBuffer
from duplex.edge.media.rtp import (
    DtmfEvent,
    RtpError,
    RtpPacket,
    RtpPacketizer,
    parse_rtp,
)

FFMPEG_NAMES = {"PCMU": "pcm_mulaw", "PCMA": "pcm_alaw"}
ALL_INT16 = np.arange(-32768, 32768, dtype=np.int32).astype(np.int16)


def _ffmpeg_encode(codec: str, pcm: np.ndarray) -> np.ndarray:
    ctx = av.CodecContext.create(FFMPEG_NAMES[codec], "w")
    ctx.sample_rate, ctx.layout, ctx.format = 8000, "mono", "s16"
    frame = av.AudioFrame.from_ndarray(pcm.reshape(1, -1), format="s16", layout="mono")
    frame.sample_rate = 8000
    packets = list(ctx.encode(frame)) + list(ctx.encode(None))
    return np.frombuffer(b"".join(bytes(p) for p in packets), np.uint8)


def _ffmpeg_decode(codec: str, payload: bytes) -> np.ndarray:
    ctx = av.CodecContext.create(FFMPEG_NAMES[codec], "r")
    ctx.sample_rate, ctx.layout = 8000, "mono"
    return np.concatenate([f.to_ndarray().ravel() for f in ctx.decode(av.Packet(payload))])


@pytest.mark.parametrize("codec", g711.CODECS)
def test_g711_decode_matches_ffmpeg_for_every_code(codec):
    codes = bytes(range(256))
    np.testing.assert_array_equal(g711.decode(codes, codec), _ffmpeg_decode(codec, codes))


@pytest.mark.parametrize("codec", g711.CODECS)
def test_g711_encode_is_nearest_level_and_agrees_with_ffmpeg(codec):
    ours = np.frombuffer(g711.encode(ALL_INT16, codec), np.uint8)
    theirs = _ffmpeg_encode(codec, ALL_INT16)
    ours_level = g711.decode(ours.tobytes(), codec).astype(np.int32)
    theirs_level = g711.decode(theirs.tobytes(), codec).astype(np.int32)
    # never further from the input than FFmpeg's choice, and the same code >99% of the time
    assert np.all(np.abs(ours_level - ALL_INT16) <= np.abs(theirs_level - ALL_INT16))
    assert np.mean(ours == theirs) > 0.99
    # every reconstruction level encodes back to its own code (mu-law's -0 maps to +0)
    levels = g711.decode(bytes(range(256)), codec)
    recoded = np.frombuffer(g711.encode(levels, codec), np.uint8)
    same = recoded == np.arange(256)
    assert same.sum() >= 255 and np.all(levels[~same] == 0)


def test_g711_silence_words():
    assert g711.silence_byte("PCMU") == 0xFF and g711.silence_byte("PCMA") == 0xD5


@pytest.mark.parametrize("codec", g711.CODECS)
def test_g711_round_trip_snr(codec):
    t = np.arange(8000) / 8000
    pcm = (12000 * np.sin(2 * np.pi * 440 * t)).astype(np.int16)
    back = g711.decode(g711.encode(pcm, codec), codec).astype(np.float64)
    snr = 10 * np.log10(np.sum(pcm.astype(np.float64) ** 2) / np.sum((back - pcm) ** 2))
    assert snr > 35  # G.711 gives ~38 dB on a loud tone


def _tone(rate: int, seconds: float, freq: float = 440.0) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return (10000 * np.sin(2 * np.pi * freq * t)).astype(np.int16)


def _dominant_hz(pcm: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(pcm.astype(np.float64)))
    return float(np.argmax(spectrum) * rate / len(pcm))


def test_resampler_streams_without_seams():
    tone = _tone(8000, 1.0)
    streamed = Resampler(16000)
    chunks = [streamed(tone[i:i + 160], 8000) for i in range(0, len(tone), 160)]
    out = np.concatenate(chunks)
    assert abs(len(out) - 16000) < 100
    assert abs(_dominant_hz(out[1000:15000], 16000) - 440) < 3
    # no clicks between frames: sample-to-sample steps stay within the tone's own slope
    max_step = 10000 * 2 * np.pi * 440 / 16000
    assert np.max(np.abs(np.diff(out[200:].astype(np.int32)))) < 1.2 * max_step


def test_phone_decoder_and_encoder_round_trip_48k():
    tone = _tone(48000, 1.0, 1000)
    encoder = PhoneEncoder("PCMU", 48000)
    payloads = []
    for i in range(0, len(tone), 960):
        encoder.push(tone[i:i + 960])
        while (payload := encoder.pop_frame()) is not None:
            payloads.append(payload)
    assert all(len(p) == PHONE_FRAME for p in payloads) and len(payloads) >= 48
    decoder = PhoneDecoder("PCMU", 16000)
    out = np.concatenate([decoder(p) for p in payloads])
    assert abs(_dominant_hz(out[800:], 16000) - 1000) < 3
    rms = np.sqrt(np.mean(out[800:].astype(np.float64) ** 2))
    assert 0.9 < rms / (10000 / np.sqrt(2)) < 1.1


def test_encoder_clear_drops_queued_audio():
    encoder = PhoneEncoder("PCMA", 8000)
    encoder.push(_tone(8000, 0.1))
    encoder.clear()
    assert encoder.pop_frame() is None


def test_rtp_round_trip_and_fields():
    packet = RtpPacket(8, 65535, 2**32 - 1, 0xDEADBEEF, b"\xd5" * 160, marker=True)
    parsed = parse_rtp(packet.serialize())
    assert parsed == packet


def test_rtp_skips_csrcs_extension_and_padding():
    header = bytes([0x80 | 0x20 | 0x10 | 2, 0]) + (7).to_bytes(2, "big") + (1).to_bytes(4, "big")
    header += (9).to_bytes(4, "big") + b"CSR1CSR2"
    extension = b"\xbe\xde\x00\x01" + b"EXT!"
    data = header + extension + b"payload" + b"\x00\x00\x03"
    parsed = parse_rtp(data)
    assert parsed.payload == b"payload" and parsed.sequence == 7 and parsed.ssrc == 9


@pytest.mark.parametrize("data", [
    b"", b"\x80\x00", bytes([0x40, 0]) + bytes(10), bytes([0x80, 200]) + bytes(10),
    bytes([0x8F, 0]) + bytes(10), bytes([0x90, 0]) + bytes(10) + b"\x00\x00\x00\x09",
    bytes([0xA0, 0]) + bytes(10) + b"\x00", bytes([0x80, 0]) + bytes(2000),
])
def test_rtp_rejects_malformed(data):
    with pytest.raises(RtpError):
        parse_rtp(data)


def test_packetizer_continuity_across_wrap():
    packetizer = RtpPacketizer(0, 160)
    packets = [parse_rtp(packetizer.packetize(b"\xff" * 160, talkspurt_start=(i == 5)))
               for i in range(70000)]
    assert packets[0].marker and packets[5].marker and not packets[1].marker
    seqs = np.array([p.sequence for p in packets], np.int64)
    stamps = np.array([p.timestamp for p in packets], np.int64)
    assert np.all(np.diff(seqs) % 65536 == 1)  # wraps 65535 -> 0 once
    assert np.all(np.diff(stamps) % 2**32 == 160)
    assert len({p.ssrc for p in packets}) == 1


def test_dtmf_event_parse():
    event = DtmfEvent.parse(bytes([11, 0x80 | 10, 0x03, 0x20]))
    assert event == DtmfEvent("#", True, 800)
    with pytest.raises(RtpError):
        DtmfEvent.parse(bytes([16, 0, 0, 0]))
    with pytest.raises(RtpError):
        DtmfEvent.parse(b"\x01")


def _drain(buffer: JitterBuffer, ticks: int) -> list[bytes | None]:
    return [buffer.pop() for _ in range(ticks)]


def test_jitter_buffer_reorders_and_primes():
    buffer = JitterBuffer(depth=3)
    buffer.put(10, b"a")
    assert buffer.pop() is None  # not primed yet
    buffer.put(12, b"c")
    buffer.put(11, b"b")
    assert _drain(buffer, 3) == [b"a", b"b", b"c"]
    assert buffer.stats.played == 3 and buffer.stats.lost == 0


def test_jitter_buffer_loss_late_duplicate():
    buffer = JitterBuffer(depth=2)
    for seq in (100, 101, 103, 101):
        buffer.put(seq, bytes([seq]))
    assert buffer.stats.duplicate == 1
    assert _drain(buffer, 4) == [b"d", b"e", None, b"g"]  # 102 lost
    buffer.put(102, b"late")
    assert buffer.stats.late == 1 and buffer.stats.lost == 1


def test_jitter_buffer_keeps_its_delay_through_jitter():
    buffer = JitterBuffer(depth=2)
    buffer.put(1, b"1")
    buffer.put(2, b"2")
    assert _drain(buffer, 3) == [b"1", b"2", None]  # 3 is late: its slot plays silence
    buffer.put(3, b"3")  # ... and it is dropped, so the delay does not grow
    buffer.put(4, b"4")
    assert buffer.pop() == b"4"
    assert buffer.stats.late == 1 and buffer.stats.underruns == 1 and buffer.stats.lost == 1


def test_jitter_buffer_restarts_after_the_stream_stops():
    buffer = JitterBuffer(depth=2)
    buffer.put(1, b"1")
    buffer.put(2, b"2")
    _drain(buffer, 2 + 12)  # the sender went quiet (silence suppression)
    buffer.put(3, b"3")  # resumes with the next sequence number
    assert buffer.pop() is None  # priming again
    buffer.put(4, b"4")
    assert _drain(buffer, 2) == [b"3", b"4"] and buffer.stats.late == 0


def test_jitter_buffer_wraps_and_resyncs():
    buffer = JitterBuffer(depth=2)
    for seq in (65534, 65535, 0, 1):
        buffer.put(seq, bytes([seq & 0xFF]))
    assert _drain(buffer, 4) == [b"\xfe", b"\xff", b"\x00", b"\x01"]
    buffer.put(30000, b"x")  # a restarted sender far away in sequence space
    buffer.put(30001, b"y")
    assert buffer.stats.resyncs == 1
    assert _drain(buffer, 2) == [b"x", b"y"]


def test_jitter_buffer_is_bounded():
    buffer = JitterBuffer(depth=1, capacity=10)
    buffer.put(0, b"0")
    for seq in range(1, 60):
        buffer.put(seq, b"x")
    assert len(buffer) <= 10 and buffer.stats.overflow > 0
