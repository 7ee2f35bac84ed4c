"""Audio read from an HTTP TTS response as it streams in: raw 16-bit little-endian mono PCM at a
rate agreed beforehand (OpenAI's ``pcm``: 24 kHz), or a WAV whose header says the rate. Pieces
arrive cut anywhere (a sample's two bytes may straddle two pieces, the header may come in
bits); each ``push`` gives the whole samples it completes. What we cannot play is the server's
error (``ServiceError``), named like the Wyoming stage's."""

from __future__ import annotations

import struct

import numpy as np

from duplex.models.speech.client import MAX_RATE, MIN_RATE, ServiceError

MAX_HEADER = 64 * 1024  # a WAV header (RIFF, fmt, and the chunks before data) longer than this is garbage
_PCM_TAG, _EXTENSIBLE_TAG = 1, 0xFFFE


class PcmDecoder:
    """16-bit mono PCM at a known rate; an odd byte waits for its pair."""

    def __init__(self, rate: int, where: str) -> None:
        self.rate, self.where = rate, where
        self._odd = b""

    def push(self, data: bytes) -> list[tuple[np.ndarray, int]]:
        data = self._odd + data
        whole = len(data) - len(data) % 2
        self._odd = data[whole:]
        if not whole:
            return []
        return [(np.frombuffer(data[:whole], "<i2").astype(np.float32) / 32768.0, self.rate)]

    def end(self) -> None:
        if self._odd:
            raise ServiceError(f"{self.where} ended its audio mid-sample (an odd number of bytes of 16-bit audio)")


class WavDecoder:
    """A WAV stream: the header is read first (its data size is not trusted: a streaming server
    cannot know it), then what follows the ``data`` chunk's header is PCM at the header's rate."""

    def __init__(self, where: str) -> None:
        self.where = where
        self._head = b""
        self._pcm: PcmDecoder | None = None

    def push(self, data: bytes) -> list[tuple[np.ndarray, int]]:
        if self._pcm is not None:
            return self._pcm.push(data)
        self._head += data
        found = self._parse()
        if found is None:
            if len(self._head) > MAX_HEADER:
                raise ServiceError(f"{self.where} sent a WAV header longer than {MAX_HEADER} bytes")
            return []
        rate, start = found
        self._pcm = PcmDecoder(rate, self.where)
        rest, self._head = self._head[start:], b""
        return self._pcm.push(rest)

    def end(self) -> None:
        if self._pcm is None:
            raise ServiceError(f"{self.where} ended its answer before the WAV header did"
                               f" ({len(self._head)} bytes)")
        self._pcm.end()

    def _parse(self) -> tuple[int, int] | None:
        """(rate, where the samples start), or None while the header is not all here."""
        head = self._head
        if len(head) >= 12 and (head[:4] != b"RIFF" or head[8:12] != b"WAVE"):
            raise ServiceError(f"{self.where} sent something that is not a WAV ({bytes(head[:12])!r})")
        at, rate = 12, None
        while len(head) >= at + 8:
            name, size = head[at:at + 4], struct.unpack("<I", head[at + 4:at + 8])[0]
            if name == b"data":
                if rate is None:
                    raise ServiceError(f"{self.where} sent a WAV with no format chunk before its data")
                return rate, at + 8
            if len(head) < at + 8 + size:
                return None
            if name == b"fmt ":
                rate = self._format(head[at + 8:at + 8 + size])
            at += 8 + size + size % 2  # chunks are padded to an even length
        return None

    def _format(self, fmt: bytes) -> int:
        if len(fmt) < 16:
            raise ServiceError(f"{self.where} sent a WAV format chunk of {len(fmt)} bytes")
        tag, channels, rate, _, _, bits = struct.unpack("<HHIIHH", fmt[:16])
        if tag not in (_PCM_TAG, _EXTENSIBLE_TAG) or bits != 16 or channels != 1 or not MIN_RATE <= rate <= MAX_RATE:
            raise ServiceError(f"{self.where} sent audio we cannot play (format {tag}, rate {rate}, {bits} bits, "
                               f"channels {channels}; expected 16-bit PCM mono at {MIN_RATE}-{MAX_RATE} Hz)")
        return rate


def audio_decoder(response_format: str, pcm_rate: int, where: str) -> PcmDecoder | WavDecoder:
    return WavDecoder(where) if response_format == "wav" else PcmDecoder(pcm_rate, where)
