"""What the agent played, as the echo gate compares it with the caller's microphone: 16 kHz mono
on the output stream's clock, one pulled frame at a time (silence counts too, so the reference
has no holes)."""

from __future__ import annotations

import numpy as np

from duplex.audio import SESSION_RATE, Resampler
from duplex.session.echo import EchoGate
from duplex.session.playout import OutputFormat


class OutputReference:
    def __init__(self, fmt: OutputFormat, echo: EchoGate) -> None:
        self._format = fmt
        self._echo = echo
        self._resampler = Resampler(SESSION_RATE)
        self._silence = np.zeros(SESSION_RATE * fmt.frame_ms // 1000, np.int16)

    def played(self, pcm: np.ndarray, audible: bool, due: float) -> None:
        """One output frame (int16 interleaved, in the output format) due at ``due``."""
        end = due + self._format.frame_ms / 1000
        if not audible:
            self._echo.record_output(self._silence, end)
            return
        mono = self._resampler(pcm, self._format.sample_rate, self._format.channels)
        if mono.size:
            self._echo.record_output(mono, end)
