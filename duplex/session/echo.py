"""Echo gating: tell the agent's own voice, returning through the caller's microphone, from the
caller speaking.

Without echo cancellation (a phone on speaker, a laptop without AEC) the microphone hears the
agent at a reduced level after some delay; a VAD would call that speech and the agent would
interrupt itself. The gate keeps what was played (16 kHz mono, addressed by the output stream's
clock) and, for each input frame, asks how much of it is coherent with the recent output:

* the echo path's delay is found by normalised cross-correlation of the last ``TRACK_MS`` of
  input against every lag up to ``max_delay_ms`` (FFT), and kept while the match is strong;
* a frame is echo when its normalised correlation with the output at that delay (a few ms
  either way) is at least ``min_correlation``. Correlation is the share of the frame's amplitude
  the output explains: echo alone scores ~0.9+, a caller talking over the echo ~sqrt(Eecho/Etotal),
  so a caller as loud as the echo or louder gets through.

Only frames with an audible output in range are ever gated; with the agent silent it is a no-op.
"""

from __future__ import annotations

import numpy as np

from duplex.audio import SESSION_RATE
from duplex.config.session import EchoConfig

TRACK_MS = 200  # input span used to find the delay; long enough to hold a syllable
_TRACK_MIN_CORRELATION = 0.8  # a delay is adopted only from a clear match
# When the path's delay jumps (a client's jitter buffer restarts, frames are lost), the long
# span still matches the old delay for most of its length, and the echo meanwhile reaches the
# VAD. A short span of only the newest input finds the new delay within two frames. Its bar is
# the long span's: echo that went through Opus twice scores only ~0.8-0.9 even when clean.
QUICK_TRACK_MS = 40
_NEAR_MS = 3  # the per-frame check looks this far either side of the tracked delay


class EchoGate:
    def __init__(self, config: EchoConfig) -> None:
        self.config = config
        self._max_delay = SESSION_RATE * config.max_delay_ms // 1000
        self._track_len = SESSION_RATE * TRACK_MS // 1000
        self._quick_len = SESSION_RATE * QUICK_TRACK_MS // 1000
        self._near = SESSION_RATE * _NEAR_MS // 1000
        self._ref = np.zeros(self._max_delay + self._track_len + 2 * SESSION_RATE // 10, np.float32)
        self._ref_end: float | None = None  # output-clock time (s) just after the newest sample
        self._input = np.zeros(self._track_len, np.float32)
        self._delay: int | None = None  # samples from output to input, once tracked
        self._floor = (10 ** (config.reference_floor_dbfs / 20)) ** 2
        self.gated_frames = 0

    @property
    def delay_ms(self) -> float | None:
        return None if self._delay is None else 1000.0 * self._delay / SESSION_RATE

    def record_output(self, samples: np.ndarray, end_time: float) -> None:
        """Output just handed to the caller: int16 or float mono 16 kHz ending at ``end_time``
        (seconds on the clock the input times use). Gaps in time are kept as silence."""
        x = _as_float(samples)
        if self._ref_end is not None:
            gap = round((end_time - len(x) / SESSION_RATE - self._ref_end) * SESSION_RATE)
            if 0 < gap < len(self._ref):
                x = np.concatenate([np.zeros(gap, np.float32), x])
        self._ref_end = end_time
        x = x[-len(self._ref):]
        self._ref = np.concatenate([self._ref[len(x):], x])

    def is_echo(self, frame: np.ndarray, end_time: float) -> bool:
        """Whether this input frame (int16 mono 16 kHz, ending at ``end_time``) is explained by
        the agent's recent output. Also keeps the delay estimate current."""
        if not self.config.enabled:
            return False
        x = _as_float(frame)
        self._input = np.concatenate([self._input[len(x):], x])
        if _mean_power(x) < self._floor:  # nothing audible to explain (a headset, a muted mic):
            return False  # no search, which costs two FFT correlations per frame while the agent talks
        segment = self._reference_before(end_time, self._track_len + self._max_delay)
        if segment is None or _mean_power(segment) < self._floor / 4:
            return False
        if self._delay is None or not self._near_match(x, segment):
            self._track_delay(segment)
        if self._delay is None:
            return False
        echo = self._near_match(x, segment)
        self.gated_frames += echo
        return echo

    def reset(self) -> None:
        self._delay = None

    def _reference_before(self, end_time: float, length: int) -> np.ndarray | None:
        """The ``length`` output samples that ended at ``end_time`` (newest last); time after
        the newest recorded output reads as silence (it has not been played yet)."""
        if self._ref_end is None:
            return None
        lag = round((self._ref_end - end_time) * SESSION_RATE)
        if lag < 0:
            ahead = min(-lag, length)
            return np.concatenate([self._ref[len(self._ref) - (length - ahead):], np.zeros(ahead, np.float32)])
        stop = len(self._ref) - lag
        if stop < length:
            return None
        return self._ref[stop - length:stop]

    def _track_delay(self, segment: np.ndarray) -> None:
        """Full search: correlate recent input against every delay. The newest QUICK_TRACK_MS
        first: after a jump the long span still matches the delay that was (mostly old input),
        which the newest frame no longer has; then the long span, for a first lock."""
        for span in (self._quick_len, self._track_len):
            rho = _normalised_xcorr(self._input[-span:], segment[-(span + self._max_delay):])
            best = int(np.argmax(rho))
            if rho[best] >= _TRACK_MIN_CORRELATION:
                self._delay = self._max_delay - best  # offset in the segment -> delay
                return

    def _near_match(self, frame: np.ndarray, segment: np.ndarray) -> bool:
        """Is this frame coherent with the output at the tracked delay (± a few ms)?"""
        if self._delay is None:
            return False
        n = len(frame)
        stop = len(segment) - self._delay
        lo, hi = max(stop - self._near - n, 0), min(stop + self._near, len(segment))
        window = segment[lo:hi]
        if len(window) < n or _mean_power(window) < self._floor:
            return False
        return float(np.max(_normalised_xcorr(frame, window))) >= self.config.min_correlation


def _as_float(samples: np.ndarray) -> np.ndarray:
    if samples.dtype == np.int16:
        return samples.astype(np.float32) / 32768.0
    return samples.astype(np.float32, copy=False)


def _mean_power(x: np.ndarray) -> float:
    return float(np.mean(x.astype(np.float64) ** 2)) if len(x) else 0.0


def _normalised_xcorr(x: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """rho[o] = <x, ref[o:o+len(x)]> / (|x| |ref[o:o+len(x)]|) for every offset o."""
    n, m = len(x), len(ref)
    size = 1 << int(np.ceil(np.log2(n + m)))
    dot = np.fft.irfft(np.conj(np.fft.rfft(x, size)) * np.fft.rfft(ref, size), size)[: m - n + 1]
    energy = np.concatenate([[0.0], np.cumsum(ref.astype(np.float64) ** 2)])
    window_energy = energy[n:] - energy[:-n]
    norm = np.sqrt(np.maximum(window_energy, 1e-12) * max(float(np.dot(x, x)), 1e-12))
    return dot / norm
