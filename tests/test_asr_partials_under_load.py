"""The streaming ASR's partials give way under load (``StreamingPolicy.partial_speakers``): with
one or two callers speaking, a partial follows every ``partial_interval_s`` of new speech; with six
at once each one's partials come three times less often, and every final transcript is still made.
A transcriber that counts its clips stands in for Whisper: what is tested is the policy (which
clips are transcribed when), on a clock the test moves."""

from __future__ import annotations

import numpy as np

from duplex.models.local.asr import Heard, StreamingASR, StreamingPolicy
from duplex.runtime.contract import CallerAudio, Transcript, WorkItem

CHUNK_S = 0.1  # the session feeds 100 ms at a time
SPEECH_S = 6.0


class CountingTranscriber:
    def __init__(self) -> None:
        self.clips = 0

    def hear(self, clips: list[np.ndarray], window_frames: int) -> list[Heard]:
        self.clips += len(clips)
        return [Heard(f"words {len(clip)}", no_speech_prob=0.0, avg_logprob=-0.1) for clip in clips]


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def _speech_chunk() -> CallerAudio:
    samples = np.full(int(CHUNK_S * 16000), 0.1, np.float32)
    return CallerAudio(samples, [True] * 5, 20)


def _speak_together(callers: int) -> tuple[int, list[list[Transcript]]]:
    """``callers`` requests streaming speech side by side, one chunk each per step, then their ends;
    (clips transcribed, what each request emitted)."""
    transcriber, clock = CountingTranscriber(), Clock()
    asr = StreamingASR(transcriber, StreamingPolicy(partial_interval_s=1.0, partial_speakers=2), clock=clock)  # type: ignore[arg-type]
    states: list[dict] = [{} for _ in range(callers)]
    emitted: list[list[Transcript]] = [[] for _ in range(callers)]
    steps = round(SPEECH_S / CHUNK_S)
    for step in range(steps + 1):
        eos = step == steps
        items = [WorkItem(f"r{n}", "client", _speech_chunk(), eos) for n in range(callers)]
        for n, out in enumerate(asr(items, states)):
            emitted[n] += out
        clock.now += CHUNK_S
    return transcriber.clips, emitted


def test_partials_come_at_the_interval_for_a_few_callers_and_less_often_for_a_crowd():
    clips_alone, (alone,) = _speak_together(1)
    clips_pair, pair = _speak_together(2)
    clips_crowd, crowd = _speak_together(6)
    partials = lambda out: sum(not t.final for t in out)
    assert partials(alone) == SPEECH_S / 1.0 and all(partials(out) == partials(alone) for out in pair)
    assert all(partials(out) == SPEECH_S / 3.0 for out in crowd)  # 6 speakers / 2: every 3 s
    for out in [alone, *pair, *crowd]:  # every request still gets its final transcript
        assert out[-1].final and out[-1].text
        assert all(t.avg_logprob == -0.1 and t.no_speech_prob == 0.0 for t in out)  # with the words' confidence
    assert clips_crowd / 6 < clips_alone / 2  # per caller, well under half the model's work
    assert clips_pair == 2 * clips_alone


def _pause_together(callers: int) -> list[list[Transcript]]:
    """``callers`` requests: 1 s of speech, then 0.3 s of silence, then their ends (a turn that
    pauses and is over); what each request emitted before its end."""
    transcriber, clock = CountingTranscriber(), Clock()
    asr = StreamingASR(transcriber, StreamingPolicy(partial_interval_s=2.0, settle_s=0.1, partial_speakers=2),  # type: ignore[arg-type]
                       clock=clock)
    states: list[dict] = [{} for _ in range(callers)]
    emitted: list[list[Transcript]] = [[] for _ in range(callers)]
    quiet = CallerAudio(np.zeros(int(CHUNK_S * 16000), np.float32), [False] * 5, 20)
    for chunk in [_speech_chunk()] * 10 + [quiet] * 3:
        items = [WorkItem(f"r{n}", "client", chunk, False) for n in range(callers)]
        for n, out in enumerate(asr(items, states)):
            emitted[n] += out
        clock.now += CHUNK_S
    return emitted


def test_a_settled_pause_is_transcribed_at_once_for_a_few_callers_and_not_in_a_crowd():
    """Alone, the settled pause's partial covers the whole turn (its end then needs no model call);
    in a crowd the final at the end of the turn does that work once."""
    (alone,) = _pause_together(1)
    assert [t.text for t in alone] == [f"words {17600}"]  # the 1 s of speech and 0.1 s settled, at the pause
    crowd = _pause_together(6)
    assert all(out == [] for out in crowd)
