"""Per-session settings: turn detection (VAD hysteresis), echo gating, output pacing."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class VadConfig(_Strict):
    """webrtcvad with hysteresis. A frame counts as voiced only when webrtcvad says speech AND
    its level clears the noise floor: webrtcvad alone keeps saying "speech" for ~100 ms after
    a click or noise burst ends (its hangover), which would turn bursts into turns."""

    aggressiveness: int = Field(2, ge=0, le=3)
    frame_ms: int = 20  # webrtcvad accepts 10, 20 or 30
    min_speech_ms: int = Field(80, ge=20, le=2000)  # voiced audio needed to declare speech start
    start_window_ms: int = Field(120, ge=20, le=5000)  # ... within this much recent audio
    silence_ms: int = Field(500, ge=60, le=10_000)  # unvoiced audio that ends a turn
    prefix_padding_ms: int = Field(300, ge=0, le=2000)  # audio before the onset that joins the turn
    min_level_dbfs: float = -50.0  # quieter frames are never speech
    floor_margin_db: float = 12.0  # a voiced frame must be this far above the noise floor

    @model_validator(mode="after")
    def _check(self) -> VadConfig:
        if self.frame_ms not in (10, 20, 30):
            raise ValueError("vad.frame_ms must be 10, 20 or 30 (webrtcvad frame sizes)")
        if self.start_window_ms < self.min_speech_ms:
            raise ValueError("vad.start_window_ms must be >= vad.min_speech_ms")
        return self


class EchoConfig(_Strict):
    """Echo gating: input explained by the agent's own recent output is not the user."""

    enabled: bool = True
    max_delay_ms: int = Field(600, ge=20, le=2000)  # longest output -> microphone path we expect
    window_ms: int = Field(100, ge=20, le=1000)  # input span compared with the output
    min_correlation: float = Field(0.6, gt=0, lt=1)  # at/above: the input is mostly echo
    reference_floor_dbfs: float = -55.0  # output quieter than this cannot echo audibly


class PreemptConfig(_Strict):
    """Preemptive generation: when the caller pauses for ``pause_ms`` (less than the end-of-turn
    silence), the turn's input is closed so the pipeline starts answering while the session
    waits out the rest of the silence; the answer's audio is held back until the turn really
    ends. If the caller speaks again first, that response is aborted and the whole turn goes
    into a fresh one."""

    enabled: bool = False
    pause_ms: int = Field(200, ge=20, le=10_000)


class BargeInConfig(_Strict):
    """What a speech onset during the agent's reply does (``overlap.py``). ``onset``: it
    interrupts at once, as every onset used to. ``listen``: the reply's audio pauses at once
    (the caller hears it stop as quickly) but the reply stays alive while the session listens;
    speech that goes on for ``interrupt_ms`` (voiced), or an overlap longer than
    ``max_overlap_ms``, interrupts; one that ends first (``resume_ms`` unvoiced) was a
    backchannel or a noise, and the reply resumes where it paused."""

    mode: Literal["listen", "onset"] = "listen"
    interrupt_ms: int = Field(600, ge=80, le=5000)
    resume_ms: int = Field(300, ge=40, le=2000)
    max_overlap_ms: int = Field(1500, ge=100, le=10_000)
    noise_ms: int = Field(200, ge=0, le=2000)  # voiced overlap shorter than this is called noise
    rejoin_ms: int = Field(500, ge=0, le=5000)  # a sound this soon after a false onset continues it

    @model_validator(mode="after")
    def _check(self) -> BargeInConfig:
        if self.max_overlap_ms < self.interrupt_ms:
            raise ValueError("barge_in.max_overlap_ms must be >= barge_in.interrupt_ms")
        return self


class SessionConfig(_Strict):
    vad: VadConfig = Field(default_factory=VadConfig)
    echo: EchoConfig = Field(default_factory=EchoConfig)
    preemptive_generation: PreemptConfig = Field(default_factory=PreemptConfig)
    barge_in: BargeInConfig = Field(default_factory=BargeInConfig)
    max_turn_s: float = Field(30.0, gt=0, le=600)  # a turn longer than this is committed anyway
    # server_vad: the session's VAD ends turns; none: the client does (input_audio_buffer.commit)
    turn_detection: Literal["server_vad", "none"] = "server_vad"
    instructions: str = Field("", max_length=32_768)
    # Send the pipeline a ``{"session_end": true}`` request at hang-up so stages that keep
    # per-session state (the local thinker's history and conversation KV) free it. Only for
    # pipelines whose stages know that request: others would answer it like a turn.
    end_of_session_request: bool = False

    @model_validator(mode="after")
    def _check(self) -> SessionConfig:
        preempt = self.preemptive_generation
        if preempt.enabled and preempt.pause_ms >= self.vad.silence_ms:
            raise ValueError(f"preemptive_generation.pause_ms ({preempt.pause_ms}) must be shorter than "
                             f"vad.silence_ms ({self.vad.silence_ms}), the silence that ends a turn")
        return self

    @property
    def pause_ms(self) -> int | None:
        """The pause that starts a speculative response, or None when preemption is off."""
        return self.preemptive_generation.pause_ms if self.preemptive_generation.enabled else None
