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
    # voiced audio within start_window_ms that goes on a turn after a silence began: a lone frame
    # of a steady noise that clears the gate does not break a pause (one frame's length: any frame does)
    resume_speech_ms: int = Field(80, ge=10, le=2000)
    silence_ms: int = Field(500, ge=60, le=10_000)  # unvoiced audio that ends a turn
    prefix_padding_ms: int = Field(300, ge=0, le=2000)  # audio before the onset that joins the turn
    min_level_dbfs: float = -50.0  # quieter frames are never speech
    # a voiced frame must be this far above the noise floor (the quietest recent frames). Once a
    # steady noise has raised the floor to it, a caller 10 dB over it clears 12 dB in few frames:
    # 7 hears them (the turn-taking corpus with --background-s, docs/benchmarks/turn-corpus.md);
    # a noise's peaks that clear it alone are not speech (resume_speech_ms, min_speech_ms)
    floor_margin_db: float = Field(7.0, ge=0, le=40)

    @model_validator(mode="after")
    def _check(self) -> VadConfig:
        if self.frame_ms not in (10, 20, 30):
            raise ValueError("vad.frame_ms must be 10, 20 or 30 (webrtcvad frame sizes)")
        if self.start_window_ms < max(self.min_speech_ms, self.resume_speech_ms):
            raise ValueError("vad.start_window_ms must be >= vad.min_speech_ms and vad.resume_speech_ms")
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
    backchannel or a noise, and the reply resumes where it paused.

    ``words`` (where the pipeline's ASR hears an overlap: ``SessionConfig.overlap_probe_request``):
    the overlap's audio is transcribed too, and the words decide: a backchannel ("uh-huh", "yeah",
    "okay", ``words.BACKCHANNELS``) resumes; ``min_words`` other words, or one that takes
    the floor alone ("sorry", "stop", "no": ``words.FLOOR_WORDS``), interrupt, even before
    the sound ended; fewer words, no words, or none within ``words_wait_ms`` of the sound's end,
    leave the verdict to the sound. The words are final once ``words_final_ms`` of
    the sound's end is unvoiced (the ASR's input closes then): final words that are all a
    backchannel resume the reply at once, sooner than ``resume_ms`` of silence would."""

    mode: Literal["listen", "onset"] = "listen"
    interrupt_ms: int = Field(600, ge=80, le=5000)
    resume_ms: int = Field(300, ge=40, le=2000)
    max_overlap_ms: int = Field(1500, ge=100, le=10_000)
    noise_ms: int = Field(200, ge=0, le=2000)  # voiced overlap shorter than this is called noise
    rejoin_ms: int = Field(500, ge=0, le=5000)  # a sound this soon after a false onset continues it
    words: bool = True  # judge by the words too, where the pipeline transcribes an overlap
    words_wait_ms: int = Field(1200, ge=0, le=5000)  # after the sound's end, the longest wait for its words
    words_final_ms: int = Field(120, ge=20, le=2000)  # unvoiced after the sound: its words are final
    # voiced audio that pauses a live reply (vad.min_speech_ms, if lower): a pause is undone when
    # the sound turns out no interruption, so it may come sooner than a turn's start
    pause_speech_ms: int = Field(60, ge=20, le=2000)
    # words that take the floor: at least this many that are not all a backchannel, or one of
    # words.FLOOR_WORDS ("stop", "wait", "sorry"); fewer are left to the sound (Whisper
    # hears a lone "uh-huh" as "I" or a made-up word)
    min_words: int = Field(2, ge=1, le=20)
    # words the recogniser was less sure of than this (its mean log-probability per token, where
    # it gives one) are no words: Whisper's sentences made up from a noise ("I'm not sure.") come
    # with far less confidence than a caller's words; None: every word counts
    min_logprob: float | None = Field(-1.8, ge=-20, le=0)
    # words the sound was too long for: two or more (none of words.FLOOR_WORDS) that came with more
    # than this much voiced audio each are a hum's made-up words (Whisper writes "Em em them." for
    # a long "mm-hmm"; a caller's words come faster); None: no ceiling. On the synthetic corpus's
    # held-out voices it cut a backchannel 0.16 of the time against 0.21, and honoured interruptions
    # 0.966 against 0.970 (docs/benchmarks/turn-corpus.md)
    max_voiced_ms_per_word: int | None = Field(300, ge=100, le=5000)
    # the same ceiling where the learned reading of the sound (``sound: learned``) hears the
    # overlap so far as more likely a backchannel or a noise than a caller taking the floor: words
    # over such a sound count only when they come at a brisk caller's pace (Whisper's "And make
    # him." over a "mhm" comes as fast as a slow caller's words: the sound tells them apart; a
    # floor word or a lone word is read as without it); the lower of the two ceilings applies.
    # None: the sound does not change the ceiling. On the synthetic corpus's held-out voices it
    # cut a backchannel 0.14 of the time against 0.16, and honoured interruptions 0.964 against
    # 0.966 (docs/benchmarks/turn-corpus.md)
    max_voiced_ms_per_word_other: int | None = Field(200, ge=100, le=5000)
    # who reads the overlap's words: ``learned``, the model trained on many synthetic voices, rooms
    # and lines (duplex/session/turn_model.json: the words with the sound's voicing, periodicity and
    # level); ``rules``, the word lists (words.BACKCHANNELS, FLOOR_WORDS) and min_words
    judge: Literal["rules", "learned"] = "rules"
    # what the sound alone decides when its time would interrupt (interrupt_ms voiced, or
    # max_overlap_ms), where the words are coming: ``voiced``, it interrupts; ``learned``, the
    # learned reading of the sound so far (duplex/session/turn_model.json: its bursts, pitch,
    # flatness, level, how its level repeats) holds one it hears as a backchannel or a noise for
    # its words, which then decide; read again as a caller taking the floor, or at max_held_ms, it
    # interrupts. ``learned`` is the default: on the held-out voices of the synthetic corpus it cut
    # a noise 0.03 of the time against 0.32 and a backchannel 0.21 against 0.40, and honoured
    # interruptions as often (0.96), 60 ms later at the median (docs/benchmarks/turn-corpus.md)
    sound: Literal["voiced", "learned"] = "learned"
    # the longest a sound held for its words pauses the reply; default: twice max_overlap_ms
    max_held_ms: int | None = Field(None, ge=100, le=20_000)

    @model_validator(mode="after")
    def _check(self) -> BargeInConfig:
        if self.max_overlap_ms < self.interrupt_ms:
            raise ValueError("barge_in.max_overlap_ms must be >= barge_in.interrupt_ms")
        if self.max_held_ms is not None and self.max_held_ms < self.max_overlap_ms:
            raise ValueError("barge_in.max_held_ms must be >= barge_in.max_overlap_ms")
        return self

    @property
    def held_limit_ms(self) -> int:
        """The longest a sound held for its words pauses the reply."""
        return 2 * self.max_overlap_ms if self.max_held_ms is None else self.max_held_ms


Eagerness = Literal["low", "medium", "high", "auto"]
# eagerness -> (P(complete) at/above which a pause ends the turn, the longest pause waited for)
EAGERNESS: dict[str, tuple[float, int]] = {"high": (0.3, 1000), "medium": (0.5, 2000), "auto": (0.5, 2000),
                                           "low": (0.7, 4000)}


class SemanticTurnConfig(_Strict):
    """``turn_detection: semantic_vad``: at a pause of ``check_ms`` the turn is judged
    (``endpoint.py``): by the sound of its end (the Smart Turn model, where the server has it) and
    by its last words (a turn ending in "um", "and", "the", ... is not over). Complete: the turn
    ends there; not: it waits for more, up to the eagerness' longest pause (or ``max_silence_ms``)."""

    eagerness: Eagerness = "auto"
    check_ms: int = Field(200, ge=60, le=2000)  # the pause at which the turn is judged
    # the pause at which the answer starts (held until the turn ends), so that it is under way when
    # the judge says "complete"; default: check_ms. A pause that ends sooner costs an aborted answer.
    speculate_ms: int | None = Field(None, ge=20, le=2000)
    threshold: float | None = Field(None, ge=0, le=1)  # default: the eagerness'
    max_silence_ms: int | None = Field(None, ge=200, le=10_000)  # default: the eagerness'
    # A pipeline's setting (its ASR writes sentences: Whisper closes a finished one with . ! or ?):
    # a turn whose transcript ends with no close needs this P(complete) of the model (at least the
    # eagerness'). Whisper left Piper's "I would like to order a large", cut mid-sentence, open
    # while Smart Turn gave it 0.79 after the pause; None: the transcript's punctuation is not read.
    unclosed_at: float | None = Field(None, ge=0, le=1)
    # how a pause is judged: ``learned``, the model trained on many synthetic voices (Smart Turn's
    # probability with the turn's words: duplex/session/turn_model.json); ``rules``, the threshold
    # and the word lists above (a server without Smart Turn always judges by the rules)
    judge: Literal["rules", "learned"] = "rules"

    @property
    def complete_at(self) -> float:
        return EAGERNESS[self.eagerness][0] if self.threshold is None else self.threshold

    @property
    def longest_pause_ms(self) -> int:
        return EAGERNESS[self.eagerness][1] if self.max_silence_ms is None else self.max_silence_ms

    @property
    def speculate_at_ms(self) -> int:
        return self.check_ms if self.speculate_ms is None else self.speculate_ms

    @model_validator(mode="after")
    def _check(self) -> SemanticTurnConfig:
        if self.speculate_ms is not None and self.speculate_ms > self.check_ms:
            raise ValueError(f"semantic.speculate_ms ({self.speculate_ms}) must be at most semantic.check_ms "
                             f"({self.check_ms}): the answer to a turn judged complete must be under way")
        return self


class SessionConfig(_Strict):
    vad: VadConfig = Field(default_factory=VadConfig)
    echo: EchoConfig = Field(default_factory=EchoConfig)
    preemptive_generation: PreemptConfig = Field(default_factory=PreemptConfig)
    barge_in: BargeInConfig = Field(default_factory=BargeInConfig)
    max_turn_s: float = Field(30.0, gt=0, le=600)  # a turn longer than this is committed anyway
    # server_vad: the session's VAD ends turns after vad.silence_ms; semantic_vad: after a pause
    # judged complete (semantic); none: the client does (input_audio_buffer.commit)
    turn_detection: Literal["server_vad", "semantic_vad", "none"] = "server_vad"
    semantic: SemanticTurnConfig = Field(default_factory=SemanticTurnConfig)
    instructions: str = Field("", max_length=32_768)
    # built-in call tools the thinker may call, handled by the session through the door's call
    # control (session/call_tools.py); a client switches them with session.update tools entries
    # of type "duplex.call"
    call_tools: list[Literal["end_call", "send_dtmf", "transfer_call"]] = Field(default_factory=list, max_length=3)
    # keypad digits with gaps shorter than this reach the thinker as one group ("[the caller pressed 123#]")
    keypad_gap_ms: int = Field(1500, ge=100, le=10_000)
    # the voice the TTS stage speaks in (session.update ``voice``); "": the stage's default. A TTS
    # stage that calls a speech server checks it against the voices the server offers.
    voice: str = Field("", max_length=128)
    # Send the pipeline a ``{"session_end": true}`` request at hang-up so stages that keep
    # per-session state (the local thinker's history and conversation KV) free it. Only for
    # pipelines whose stages know that request: others would answer it like a turn.
    end_of_session_request: bool = False
    # The pipeline's entry stage recognises words (a Whisper ASR, not a sound measure): at an
    # overlap the session sends it the caller's audio as an ``OverlapProbe`` request, so
    # ``barge_in.words`` can judge by what was said. A pipeline's setting, not a client's.
    overlap_probe_request: bool = False

    @model_validator(mode="after")
    def _check(self) -> SessionConfig:
        preempt = self.preemptive_generation
        if self.semantic_turns:
            if self.semantic.check_ms >= self.semantic.longest_pause_ms:
                raise ValueError(f"semantic.check_ms ({self.semantic.check_ms}) must be shorter than the longest "
                                 f"pause waited for ({self.semantic.longest_pause_ms} ms)")
        elif preempt.enabled and preempt.pause_ms >= self.vad.silence_ms:
            raise ValueError(f"preemptive_generation.pause_ms ({preempt.pause_ms}) must be shorter than "
                             f"vad.silence_ms ({self.vad.silence_ms}), the silence that ends a turn")
        return self

    @property
    def semantic_turns(self) -> bool:
        return self.turn_detection == "semantic_vad"

    @property
    def silence_ms(self) -> int:
        """The silence after which a turn ends whatever else is known."""
        return self.semantic.longest_pause_ms if self.semantic_turns else self.vad.silence_ms

    @property
    def pause_ms(self) -> int | None:
        """The pause that starts a speculative response (semantic turns: ``semantic.speculate_ms``,
        by default ``check_ms``); None: no pause cue."""
        if self.semantic_turns:
            return self.semantic.speculate_at_ms
        return self.preemptive_generation.pause_ms if self.preemptive_generation.enabled else None

    @property
    def judge_ms(self) -> int | None:
        """The pause at which the turn is judged (semantic turns); None: turns end by silence."""
        return self.semantic.check_ms if self.semantic_turns else None
