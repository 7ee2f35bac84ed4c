"""Typed turns and text-only replies, fast: the session makes a typed request, the stages that
recognise speech pass typed text on as the transcript, the stages that voice a reply skip a
text-only one, and a text reply is announced as text."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest

from duplex.config.session import SessionConfig
from duplex.models.local.asr import StreamingASR
from duplex.models.local.stages import StreamingTTS
from duplex.models.toy_voice.stages import Ears, Mind, Voice
from duplex.runtime.contract import AgentAudio, AgentText, CallerAudio, Transcript, TurnRequest, WorkItem
from duplex.session.protocol import handle_client_message
from duplex.session.realtime import item_events as iev
from tests.session_fakes import Call, words


class _Refuses:
    """A model that must not be called."""

    def __getattr__(self, name: str):
        raise AssertionError(f"the model was called ({name}) for a typed turn / text-only reply")


def _item(data, request: TurnRequest, eos: bool = True) -> WorkItem:
    return WorkItem(request_id="r1", source="client", data=data, eos=eos, params=request)


TYPED = TurnRequest(session_id="s", text="One mango tea, please.", output_audio=False)
EMPTY = CallerAudio(np.zeros(0, np.float32), [])


def test_the_asr_passes_typed_text_on_as_the_final_transcript_without_the_model():
    asr = StreamingASR(_Refuses())  # type: ignore[arg-type]
    assert asr([_item(EMPTY, TYPED, eos=False)], [{}]) == [[]]
    assert asr([_item(EMPTY, TYPED)], [{}]) == [[Transcript("One mango tea, please.", final=True)]]
    assert asr.calls == 0


def test_the_tts_voices_nothing_of_a_text_only_reply():
    tts = StreamingTTS(_Refuses())  # type: ignore[arg-type]
    assert tts([_item(AgentText("Sure."), TYPED)], [{}]) == [[]]


def test_toy_voice_answers_typed_text_in_text_only():
    heard = Ears()([_item(EMPTY, TYPED)], [{}])[0]
    assert heard == [Transcript("One mango tea, please.", final=True)]
    reply = Mind("unused")([_item(heard[0], TYPED)], [{}])[0]
    assert "One mango tea, please." in " ".join(w.text for w in reply)
    out = Voice(pace=1000.0)([_item(reply[0], TYPED)], [{}])[0]  # pace: a text reply must not wait on it
    assert out == [AgentText(reply[0].text)] and not any(isinstance(o, AgentAudio) for o in out)


def _send(call: Call, event: dict) -> None:
    handle_client_message(call.session, json.dumps(event), "toy")


async def test_a_typed_message_is_one_request_with_its_text_and_a_text_reply_is_text():
    call = Call()
    _send(call, {"type": "conversation.item.create", "item": {"type": "message", "role": "user",
                                                              "content": [{"type": "input_text", "text": "Hi"}]}})
    _send(call, {"type": "conversation.item.create", "item": {"type": "message", "role": "user",
                                                              "content": [{"type": "input_text", "text": "there"}]}})
    added = call.of_type(iev.ItemDone)
    assert [i.item.content[0].text for i in added] == ["Hi", "there"]
    assert added[1].previous_item_id == added[0].item.id
    _send(call, {"type": "response.create", "response": {"modalities": ["text"], "instructions": "Short."}})
    turn = call.runtime.last
    assert turn.request.text == "Hi there" and not turn.request.output_audio
    assert turn.request.instructions == "Short." and turn.eos
    turn.transcript("Hi there")
    turn.say("Hello")  # a pipeline that voices anyway: its audio is dropped
    turn.complete()
    await call.settle()
    assert [e.delta for e in call.of_type(iev.TextDelta)] == ["Hello"]
    assert call.of_type(iev.TextDone)[0].text == "Hello"
    done = [e for e in call.events if type(e).__struct_config__.tag == "response.done"][0]
    assert done.response.output_modalities == ["text"] and done.response.usage.input_tokens == 2
    assert "conversation.item.input_audio_transcription.completed" not in call.types()
    assert call.session.playout.item_id is None  # nothing was queued to play


async def test_a_spoken_turn_after_session_text_mode_is_text_only_too():
    call = Call()
    _send(call, {"type": "session.update", "session": {"output_modalities": ["text"]}})
    await call.say(words("one two three"))
    await call.quiet(600)
    turn = call.runtime.last
    assert not turn.request.output_audio
    turn.say("Sure")
    turn.complete()
    await call.settle()
    assert [e.delta for e in call.of_type(iev.TextDelta)] == ["Sure"]


async def test_turn_detection_off_buffers_until_commit():
    call = Call()
    _send(call, {"type": "session.update", "session": {"audio": {"input": {"turn_detection": None}}}})
    assert call.session.config.turn_detection == "none"
    await call.say(words("one two three"))
    assert not call.runtime.turns  # no VAD: nothing starts by itself
    _send(call, {"type": "input_audio_buffer.commit"})
    _send(call, {"type": "response.create"})
    turn = call.runtime.last
    assert turn.eos and turn.request.text is None and turn.fed_ms >= 500 and any(turn.voiced)


@pytest.mark.parametrize("content, code", [
    ([{"type": "input_text", "text": "a"}, {"type": "input_audio", "audio": "AAAA"}], "mixed_content"),
    ([{"type": "input_image", "image_url": "x"}], "unsupported_content"),
    ([{"type": "input_audio", "audio": base64.b64encode(b"abc").decode()}], "invalid_audio"),
])
async def test_bad_items_are_refused_by_name(content, code):
    call = Call()
    _send(call, {"type": "conversation.item.create", "event_id": "e1",
                 "item": {"type": "message", "role": "user", "content": content}})
    errors = [e for e in call.events if type(e).__struct_config__.tag == "error"]
    assert errors and errors[-1].error.code == code and errors[-1].error.event_id == "e1"
    assert SessionConfig().turn_detection == "server_vad"


def test_the_hand_committed_buffer_keeps_only_the_newest_max_turn():
    call = Call(SessionConfig(turn_detection="none", max_turn_s=1.0))
    for _ in range(3):
        call.session.push_input(np.ones(16000, np.int16))
    assert call.session.items.buffered_ms == 1000
