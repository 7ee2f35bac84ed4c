"""The local thinker's history keeps only what the caller heard; a hang-up frees the session.

Pure parts first (no weights): the heard share of a reply, history edits, trimming cached K/V.
Then the real Gemma thinker under the real ``ar`` scheduler, driven by requests as the session
sends them (``TurnRequest.heard``, ``TurnRequest.supersedes``, ``SessionEnd``)."""

from __future__ import annotations

import pytest
import torch

from duplex.config.pipeline import StageConfig
from duplex.models.local.conversation_cache import CachedConversation, ConversationCache
from duplex.models.local.prompt import SessionHistory
from duplex.runtime.contract import Heard, SessionEnd, Transcript, WorkItem, heard_cut, heard_part
from tests.local_helpers import (
    ORDER,
    build_gemma_thinker,
    collect,
    gemma_thinker_stage,
    reply_text,
    running_ar_scheduler,
    user_turn,
    wait_until,
)

REPLY = "Sure, one bubble tea with less ice. Would you like a regular or a large?"


def test_the_heard_share_of_the_audio_keeps_that_share_of_the_words():
    # 40% of the audio heard: the words that end within the first 40% of the characters.
    assert heard_part(REPLY, 1200, 3000, 15.0) == "Sure, one bubble tea with..."
    assert heard_part(REPLY, 3000, 3000, 15.0) == REPLY  # all played: nothing cut
    assert heard_part(REPLY, 0, 3000, 15.0) == "..."  # cut before a word was heard
    # Total audio unknown (cut while the reply was still being made): nominal speaking rate.
    assert heard_part(REPLY, 1100, None, 15.0) == "Sure, one bubble..."  # 16.5 characters
    assert heard_part("", 500, None, 15.0) == "..."


def test_the_words_heard_exactly_win_over_the_estimate():
    # the session knew the text of each played chunk: those words, however long the audio was
    assert heard_cut("Sure, one", 1200, 3000, 15.0)(REPLY) == "Sure, one..."
    assert heard_cut(REPLY, 800, 3000, 15.0)(REPLY) == REPLY  # every word was played
    assert heard_cut("", 0, None, 15.0)(REPLY) == "..."
    assert heard_cut(None, 1200, 3000, 15.0)(REPLY) == heard_part(REPLY, 1200, 3000, 15.0)  # no text: estimate


def test_history_edits_cut_supersede_and_add_interrupted_turns():
    history = SessionHistory()
    history.add("Hi.", "Hello, what can I get you?", "r1")
    history.add("A taro tea.", "One taro tea. Regular or large?", "r2")
    history.interrupted = ("r3", "Large.", "Okay, a large taro tea with pearls")
    def cut(reply: str) -> str:
        return reply.split()[0] + "..."

    assert history.truncate("r2", cut)
    assert not history.truncate("r2", cut)  # a second request of the same turn repeats the edit
    assert history.turns[1] == ("A taro tea.", "One...")
    assert history.truncate("r3", cut)  # the aborted turn joins, cut to what was heard
    assert history.interrupted is None and history.turns[2] == ("Large.", "Okay,...")
    assert history.drop("r1") and not history.drop("r1")
    assert history.request_ids == ["r2", "r3"] and not history.truncate("unknown", cut)


def test_trimming_the_cached_conversation_keeps_only_the_matching_prefix():
    kv = [(torch.arange(6.0).reshape(1, 6, 1), torch.arange(6.0).reshape(1, 6, 1))]
    cache = ConversationCache(2)
    cache.put("s", CachedConversation((1, 2, 3, 4, 5, 6), kv))
    cache.trim("s", [1, 2, 3, 9])
    entry = cache.get("s")
    assert entry.tokens == (1, 2, 3) and entry.kv[0][0].shape[1] == 3
    assert entry.kv[0][0].untyped_storage().nbytes() == 3 * 4  # a copy: the cut K/V is freed
    cache.trim("absent", [1])  # nothing cached: nothing to do
    cache.forget("s")
    assert len(cache) == 0


# -- the real thinker --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def thinker_stage() -> StageConfig:
    return gemma_thinker_stage(max_new_tokens=32)


@pytest.fixture(scope="module")
def runner(thinker_stage):
    return build_gemma_thinker(thinker_stage)


@pytest.fixture
def scheduler(thinker_stage, runner):
    yield from running_ar_scheduler(thinker_stage, runner)


def _reply(scheduler, item: WorkItem) -> str:
    scheduler.inbox.put(item)
    emits = collect(scheduler, {item.request_id})[item.request_id]
    final = emits[-1]
    assert final.eos and final.error is None, final
    return reply_text(emits).strip()


def _idle(scheduler, runner) -> bool:
    return scheduler.resources()["kv_slots"] == 0 and runner.held()["open_rows"] == 0


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_history_keeps_only_what_was_heard_and_a_hang_up_frees_it(scheduler, runner):
    session = "heard"
    first = _reply(scheduler, user_turn("h1", ORDER, session_id=session))
    wait_until(lambda: _idle(scheduler, runner), what="slot release")
    cached_before = len(runner.conversations.get(session).tokens)

    # Barge-in after 40% of h1's audio; the next turn carries what was heard.
    heard = heard_part(first, 1200, 3000, runner.settings.speech_chars_per_s)
    assert heard != first
    cut = Heard(request_id="h1", audio_end_ms=1200, audio_ms=3000)
    _reply(scheduler, user_turn("h2", "Make it a large one.", session_id=session, heard=cut))
    wait_until(lambda: _idle(scheduler, runner), what="slot release")
    history = runner.histories.get(session)
    assert history.turns[0] == (ORDER, heard)
    # The prompt of h2 (and the K/V cached after it) says the heard part, not the whole reply.
    heard_turn = runner.model.encode(runner.persona.turn_text(ORDER, heard))
    assert list(runner.conversations.get(session).tokens[len(runner._prefix_ids):][:len(heard_turn)]) == heard_turn
    assert cached_before > len(runner._prefix_ids)

    # An aborted turn is set aside, then joins the history as heard (nothing, here).
    scheduler.inbox.put(user_turn("h3", "What flavors do you have?", session_id=session))
    wait_until(lambda: runner.held()["open_rows"] == 1, timeout=60, what="h3 running")
    scheduler.abort("h3")
    wait_until(lambda: _idle(scheduler, runner), timeout=30, what="abort to free the slot")
    assert history.interrupted is not None and history.interrupted[0] == "h3"
    assert [u for u, _ in history.turns] == [ORDER, "Make it a large one."]
    _reply(scheduler, user_turn("h4", "Taro, please.", session_id=session,
                                heard=Heard(request_id="h3", audio_end_ms=0)))
    wait_until(lambda: _idle(scheduler, runner), what="slot release")
    assert history.turns[2] == ("What flavors do you have?", "...")

    # A speculative turn that completed, superseded by the request holding the whole utterance.
    _reply(scheduler, user_turn("h5", "And also", session_id=session))
    wait_until(lambda: _idle(scheduler, runner), what="slot release")
    _reply(scheduler, user_turn("h6", "And also some pearls.", session_id=session, supersedes=["h5"]))
    wait_until(lambda: _idle(scheduler, runner), what="slot release")
    assert [u for u, _ in history.turns][-2:] == ["Taro, please.", "And also some pearls."]
    assert "h5" not in history.request_ids

    # Hang-up: the session's history and cached K/V go; nothing else is held.
    sessions_before = len(runner.histories)
    end = WorkItem("h-end", "asr", Transcript("", final=True), eos=True, params=SessionEnd(session_id=session))
    scheduler.inbox.put(end)
    assert collect(scheduler, {"h-end"})["h-end"][-1].eos
    wait_until(lambda: _idle(scheduler, runner), what="slot release")
    assert not runner.histories.has(session) and runner.conversations.get(session) is None
    assert len(runner.histories) == sessions_before - 1
    assert not scheduler.live_requests()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_local_thinker_refuses_tools_with_a_clear_error(scheduler, runner):
    from duplex.runtime.contract import ErrorCode, ToolSpec

    item = user_turn("tools-1", "One taro please.", "s-tools", tools=[ToolSpec("place_order")])
    scheduler.inbox.put(item)
    final = collect(scheduler, {"tools-1"})["tools-1"][-1]
    assert final.error is not None and final.error.code is ErrorCode.BAD_INPUT
    assert "the local thinker (Gemma 3 270M, a base model) cannot call functions" in final.error.message
    assert "duplex serve --llm" in final.error.message
    wait_until(lambda: _idle(scheduler, runner), what="the refused turn to leave nothing behind")
    assert _reply(scheduler, user_turn("tools-2", "Hi there.", "s-tools"))  # the stage goes on
