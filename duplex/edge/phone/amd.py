"""Answering-machine detection: is the callee of an outbound call a person or a machine?

Feed the callee's audio from the moment the call is answered (``feed``, any length, int16 mono);
a decision comes within ``decide_by_ms`` (3 s): HUMAN or MACHINE, with the reason, when it was
made, and whether a beep was seen. Keep feeding after a MACHINE decision to learn when its beep
ends (``beep_end_ms``): the moment to leave a message (``AmdPolicy.LEAVE_MESSAGE``).

What it listens for, per 20 ms frame (webrtcvad's voice decision above an energy floor, and a
spectral test for tones):

- a person answers with a short greeting ("hello?", "yes, who is this?") and then waits for the
  caller: a greeting shorter than ``machine_speech_ms`` followed by ``human_silence_ms`` of
  silence is HUMAN;
- a machine's greeting runs on ("you have reached ... please leave a message after the tone"),
  its pauses between phrases too short for a caller to answer in: a greeting (pauses under
  ``human_silence_ms`` do not end it) reaching ``machine_speech_ms`` is MACHINE;
- a beep, a steady tone of 0.9-2.1 kHz, ``beep_ms`` long or more, that holds most of the frame's
  energy within a few FFT bins of its peak, is MACHINE;
- at ``decide_by_ms`` still undecided: MACHINE if the callee is still in a long utterance, else
  HUMAN (silence too: a person who picked up and waits).

The thresholds were tuned on generated greetings (``duplex bench amd`` scores them on voices and
wordings not used to tune them).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np
import webrtcvad
from pydantic import BaseModel, ConfigDict, Field

from duplex.session.realtime.call_events import AnsweredBy

FRAME_MS = 20


class AmdVerdict(enum.StrEnum):
    HUMAN = "human"
    MACHINE = "machine"


class AmdPolicy(enum.StrEnum):
    """What an outbound call does when a machine answers."""

    LEAVE_MESSAGE = "leave_message"  # wait for the beep (or the greeting's end), then speak
    HANG_UP = "hang_up"


class AmdSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    machine_speech_ms: int = Field(1800, ge=500, le=5000)  # an utterance this long is a machine's greeting
    human_silence_ms: int = Field(700, ge=200, le=3000)  # silence after a short greeting: a person waiting
    decide_by_ms: int = Field(3000, ge=1000, le=10_000)
    beep_ms: int = Field(160, ge=60, le=1000)  # a steady tone this long is a beep
    beep_low_hz: float = 900.0
    beep_high_hz: float = 2100.0
    tonality: float = Field(0.8, gt=0, le=1)  # share of the frame's energy near its peak
    vad_mode: int = Field(2, ge=0, le=3)
    floor_dbfs: float = -45.0  # quieter frames are silence whatever the VAD says


@dataclass(frozen=True)
class AmdDecision:
    verdict: AmdVerdict
    decided_ms: int  # from the first audio fed
    reason: str
    beep: bool = False

    def event(self) -> AnsweredBy:
        """As the session's server event (``duplex.call.answered_by``), for the client and the logs."""
        return AnsweredBy(verdict=self.verdict.value, decided_ms=self.decided_ms, beep=self.beep, reason=self.reason)


class BeepDetector:
    """Steady tones in the beep band, frame by frame (20 ms hop, 40 ms Hann window)."""

    def __init__(self, sample_rate: int, settings: AmdSettings) -> None:
        self._rate = sample_rate
        self._settings = settings
        self._window = np.hanning(2 * sample_rate * FRAME_MS // 1000)
        self._previous = np.zeros(sample_rate * FRAME_MS // 1000)
        self._run = 0  # tonal frames in a row at a steady frequency
        self._run_hz = 0.0
        self.seen_ms: int | None = None  # when a beep was first long enough
        self.end_ms: int | None = None  # when that beep stopped

    def push(self, frame: np.ndarray, now_ms: int) -> None:
        hz = self._tone(frame)
        self._previous = frame
        steady = hz is not None and (self._run == 0 or abs(hz - self._run_hz) <= 50)
        if steady and hz is not None:
            self._run, self._run_hz = self._run + 1, hz
        else:
            if self.seen_ms is not None and self.end_ms is None and self._run:
                self.end_ms = now_ms  # the beep stopped: this frame is past it
            self._run = 1 if hz is not None else 0
            self._run_hz = hz or 0.0
        if self.seen_ms is None and self._run * FRAME_MS >= self._settings.beep_ms:
            self.seen_ms = now_ms + FRAME_MS

    def _tone(self, frame: np.ndarray) -> float | None:
        """The tone's frequency if this window is one steady tone in the beep band."""
        window = np.concatenate([self._previous, frame]) * self._window
        power = np.abs(np.fft.rfft(window)) ** 2
        bin_hz = self._rate / len(window)
        lo, hi = int(300 / bin_hz), int(3400 / bin_hz)
        band = power[lo:hi]
        total = float(band.sum())
        if total <= 1e-3 * len(window):  # silence
            return None
        peak = lo + int(np.argmax(band))
        hz = peak * bin_hz
        if not self._settings.beep_low_hz <= hz <= self._settings.beep_high_hz:
            return None
        near = float(power[max(peak - 2, 0):peak + 3].sum())
        return hz if near / total >= self._settings.tonality else None


class AnsweringMachineDetector:
    def __init__(self, sample_rate: int = 8000, settings: AmdSettings | None = None) -> None:
        if sample_rate not in (8000, 16000, 32000, 48000):
            raise ValueError(f"sample rate {sample_rate}: webrtcvad takes 8, 16, 32 or 48 kHz")
        self.settings = settings or AmdSettings()
        self._rate = sample_rate
        self._frame = sample_rate * FRAME_MS // 1000
        self._vad = webrtcvad.Vad(self.settings.vad_mode)
        self.beeps = BeepDetector(sample_rate, self.settings)
        self._carry = np.zeros(0, np.int16)
        self.now_ms = 0
        self._greeting_start: int | None = None  # the callee's first voiced frame
        self._last_voiced_ms = 0  # the end of their last voiced frame
        self.decision: AmdDecision | None = None

    @property
    def beep_end_ms(self) -> int | None:
        return self.beeps.end_ms

    def feed(self, pcm: np.ndarray) -> AmdDecision | None:
        """Audio in; the decision the first time one is made (None before and after)."""
        samples = np.concatenate([self._carry, np.asarray(pcm, np.int16)])
        whole = len(samples) - len(samples) % self._frame
        self._carry = samples[whole:]
        made = None
        for start in range(0, whole, self._frame):
            decision = self._push(samples[start:start + self._frame])
            if decision is not None and self.decision is None:
                self.decision = made = decision
        return made

    def _push(self, frame: np.ndarray) -> AmdDecision | None:
        self.beeps.push(frame.astype(np.float64) / 32768.0, self.now_ms)
        self.now_ms += FRAME_MS
        if self.decision is not None:
            return None
        s = self.settings
        if self.beeps.seen_ms is not None:
            return self._decide(AmdVerdict.MACHINE, "a beep", beep=True)
        if self._voiced(frame):
            start = self._greeting_start if self._greeting_start is not None else self.now_ms - FRAME_MS
            self._greeting_start = start
        if self._greeting_start is None:  # nothing said yet
            if self.now_ms >= s.decide_by_ms:
                return self._decide(AmdVerdict.HUMAN, "silence: someone waiting")
            return None
        greeting_ms = self._last_voiced_ms - self._greeting_start
        if greeting_ms >= s.machine_speech_ms:
            return self._decide(AmdVerdict.MACHINE, f"a greeting of {greeting_ms} ms with no pause to let us speak")
        if self.now_ms - self._last_voiced_ms >= s.human_silence_ms:
            return self._decide(AmdVerdict.HUMAN, f"a greeting of {greeting_ms} ms, then silence: waiting for us")
        if self.now_ms >= s.decide_by_ms:
            verdict = AmdVerdict.MACHINE if greeting_ms >= s.machine_speech_ms // 2 else AmdVerdict.HUMAN
            return self._decide(verdict, f"a greeting of {greeting_ms} ms still going at the deadline")
        return None

    def _voiced(self, frame: np.ndarray) -> bool:
        rms = float(np.sqrt(np.mean(frame.astype(np.float64) ** 2))) / 32768.0
        if rms <= 0 or 20 * np.log10(rms) < self.settings.floor_dbfs:
            return False
        voiced = self._vad.is_speech(frame.astype("<i2").tobytes(), self._rate)
        if voiced:
            self._last_voiced_ms = self.now_ms
        return voiced

    def _decide(self, verdict: AmdVerdict, reason: str, beep: bool = False) -> AmdDecision:
        return AmdDecision(verdict, self.now_ms, reason, beep or self.beeps.seen_ms is not None)
