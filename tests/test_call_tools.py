"""The call's own tools and keypad in a session (duplex/session/call_tools.py), in process against
a scripted runtime and a recording call control: call tools switched on per session and sent to
the thinker, ``end_call`` ending the call only once the reply has played, digits out through the
door's control, the client's ``duplex.call.*`` events, keypad digits in grouped into one user
item, a flood of digits bounded, and what the door cannot do refused with a reason."""

from __future__ import annotations

import asyncio
import json

from duplex.runtime.contract import ToolCallDone
from duplex.session.call_control import CallAction, CallControlRefused, TransferResult
from duplex.session.call_tools import MAX_GROUP, SPECS
from duplex.session.realtime import call_events as cev
from duplex.session.realtime import events as ev
from duplex.session.realtime import tool_events as tev
from tests.session_fakes import Call
from tests.test_session_call import ask, play_until_idle
from tests.test_session_tools import PLACE_ORDER, errors, send

END_CALL = {"type": "duplex.call", "name": "end_call"}
SEND_DTMF = {"type": "duplex.call", "name": "send_dtmf"}
TRANSFER = {"type": "duplex.call", "name": "transfer_call"}


class RecordingControl:
    """A door's call control that records what it was asked (and when, in frames played)."""

    def __init__(self, call_frames: list | None = None, dtmf: bool = True) -> None:
        self.ended: list[tuple[str, int]] = []  # (reason, output frames pulled by then)
        self.digits: list[str] = []
        self._frames = call_frames if call_frames is not None else []
        self._dtmf = dtmf

    def end(self, reason: str) -> None:
        self.ended.append((reason, len(self._frames)))

    def send_dtmf(self, digits: str) -> None:
        if not self._dtmf:
            raise CallControlRefused(CallAction.DTMF, "the far end did not offer telephone-event")
        self.digits.append(digits)

    async def transfer(self, target: str) -> TransferResult:
        return TransferResult(accepted=False, status=486, detail="busy")


def controlled() -> tuple[Call, RecordingControl]:
    frames: list = []
    control = RecordingControl(frames)
    call = Call(control=control)
    control._frames = call.played
    return call, control


def outputs(call: Call) -> dict[str, dict]:
    return {e.item.call_id: json.loads(e.item.output) for e in call.of_type(tev.OutputItemAdded)}


async def model_calls(call: Call, name: str, arguments: str, *reply: str) -> None:
    """Ask; the model says ``reply`` and calls ``name``; the reply plays out."""
    await ask(call)
    turn = call.runtime.last
    if reply:
        turn.say(*reply)
    turn._put(ToolCallDone("call_9", name, arguments))
    turn.complete()


async def test_call_tools_are_opt_in_reach_the_thinker_with_the_clients_and_are_described():
    call, _ = controlled()
    await ask(call)
    assert call.runtime.last.request.tools == []  # off unless switched on
    call.runtime.last.complete()
    await play_until_idle(call)
    send(call, {"type": "session.update", "session": {"tools": [PLACE_ORDER, END_CALL, SEND_DTMF],
                                                      "tool_choice": "end_call"}})
    described = call.of_type(ev.SessionUpdated)[-1].session
    assert [(t["type"], t["name"]) for t in described["tools"]] == [
        ("function", "place_order"), ("duplex.call", "end_call"), ("duplex.call", "send_dtmf")]
    await ask(call)
    request = call.runtime.last.request
    assert [s.name for s in request.tools] == ["place_order", "end_call", "send_dtmf"]
    assert request.tools[1] == SPECS["end_call"] and request.tool_choice == "end_call"


async def test_an_unknown_or_clashing_call_tool_is_refused_by_name():
    call, _ = controlled()
    send(call, {"type": "session.update", "session": {"tools": [{"type": "duplex.call", "name": "explode"}]}})
    send(call, {"type": "session.update", "session": {"tools": [{"type": "function", "name": "end_call"}, END_CALL]}})
    found = errors(call)
    assert [e.code for e in found] == ["invalid_session_settings"] * 2
    assert "'explode' unknown" in found[0].message and "both as a function and as a call tool" in found[1].message
    assert call.session.config.call_tools == []


async def test_end_call_lets_the_reply_finish_playing_then_ends_the_call():
    call, control = controlled()
    send(call, {"type": "session.update", "session": {"tools": [END_CALL]}})
    await model_calls(call, "end_call", "{}", "thanks", "for", "calling", "goodbye")
    await call.quiet(200)
    assert call.session.state.value == "agent_speaking" and control.ended == []  # not while it plays
    await play_until_idle(call)
    assert [reason for reason, _ in control.ended] == ["the agent ended the call"]
    ended_at = control.ended[0][1]
    assert call.loud_frames() and max(call.loud_frames()) < ended_at  # after its last word
    assert call.of_type(cev.CallEnding)[0].after_reply
    # the client saw the call and its result, and was not asked to answer it
    assert outputs(call)["call_9"]["ok"] is True
    assert [d.response.output[-1].name for d in call.of_type(ev.ResponseDone)] == ["end_call"]


async def test_send_dtmf_goes_through_the_doors_control_and_a_refusal_is_the_tools_result():
    call, control = controlled()
    send(call, {"type": "session.update", "session": {"tools": [SEND_DTMF]}})
    await model_calls(call, "send_dtmf", '{"digits": "12#"}')
    await play_until_idle(call)
    assert control.digits == ["12#"] and outputs(call)["call_9"] == {"ok": True, "detail": "sent", "digits": "12#"}
    assert call.of_type(cev.DtmfSent)[0].digits == "12#"
    # the result joins the history with the next request, not answered by a response of its own
    await ask(call)
    assert [o.call_id for o in call.runtime.last.request.tool_outputs] == ["call_9"]
    assert not call.runtime.last.request.tool_outputs[0].speak

    refusing = Call(control=RecordingControl(dtmf=False))
    send(refusing, {"type": "session.update", "session": {"tools": [SEND_DTMF]}})
    await model_calls(refusing, "send_dtmf", '{"digits": "12x"}')
    await play_until_idle(refusing)
    assert outputs(refusing)["call_9"] == {"ok": False, "detail": "not keypad digits: 'X' (0-9, *, #, A-D)"}


async def test_the_client_ends_the_call_sends_digits_and_learns_what_cannot_be_done():
    call, control = controlled()
    send(call, {"type": "duplex.call.dtmf", "digits": "5", "event_id": "e1"})
    send(call, {"type": "duplex.call.dtmf", "digits": "5%", "event_id": "e2"})
    send(call, {"type": "duplex.call.transfer", "target": "sip:desk@example.com", "event_id": "e3"})
    await asyncio.wait_for(_until(lambda: call.of_type(cev.TransferDone)), 5)
    send(call, {"type": "duplex.call.end", "after_reply": False, "event_id": "e4"})
    assert control.digits == ["5"]
    assert [(e.code, e.event_id) for e in errors(call)] == [("invalid_call_request", "e2")]
    transfer = call.of_type(cev.TransferDone)[0]
    assert (transfer.accepted, transfer.status, transfer.detail) == (False, 486, "busy")
    assert control.ended == [("the client ended the call", 0)]  # nothing playing: at once

    plain = Call()  # a door that carries no call it could steer
    send(plain, {"type": "duplex.call.dtmf", "digits": "5", "event_id": "d"})
    send(plain, {"type": "duplex.call.end", "event_id": "x"})
    send(plain, {"type": "duplex.call.hold", "event_id": "h"})
    send(plain, {"type": "duplex.call.transfer", "target": "+15550100", "event_id": "t"})
    await asyncio.wait_for(_until(lambda: plain.of_type(cev.TransferDone)), 5)
    found = errors(plain)
    assert [(e.code, e.event_id) for e in found] == [("call_control_refused", "d"), ("call_control_refused", "x"),
                                                     ("unknown_event", "h"), ("call_control_refused", "t")]
    assert "cannot send keypad digits" in found[0].message and "cannot end its call" in found[1].message


async def test_keypad_digits_reach_the_client_at_once_and_the_thinker_grouped():
    call, _ = controlled()
    call.session.reconfigure(call.session.config.model_copy(update={"keypad_gap_ms": 100}))
    for digit in "12#":  # back to back: one group
        call.session.calls.keypad(digit)
    assert [e.event for e in call.of_type(cev.DtmfReceived)] == ["1", "2", "#"]
    await asyncio.wait_for(_until(lambda: call.runtime.turns), 5)
    assert call.runtime.last.request.text == "[the caller pressed 12# on the keypad]"
    added = [e.item for e in call.of_type(ev.ItemAdded) if e.item.role == "user"]
    assert added[-1].content[0].text == "[the caller pressed 12# on the keypad]"


async def test_digits_pressed_while_the_agent_speaks_wait_for_the_reply_to_end():
    call, _ = controlled()
    call.session.reconfigure(call.session.config.model_copy(update={"keypad_gap_ms": 100}))
    await ask(call)
    call.runtime.last.say("let", "me", "check")
    call.runtime.last.complete()
    call.session.calls.keypad("7")
    await call.quiet(400)  # the group closed while the reply played
    assert len(call.runtime.turns) == 1
    await play_until_idle(call)
    await asyncio.wait_for(_until(lambda: len(call.runtime.turns) == 2), 5)
    assert call.runtime.last.request.text == "[the caller pressed 7 on the keypad]"


async def test_a_flood_of_digits_is_capped_and_said_once():
    call, _ = controlled()
    call.session.reconfigure(call.session.config.model_copy(update={"keypad_gap_ms": 100}))
    for _ in range(500):
        call.session.calls.keypad("9")
    floods = [e for e in errors(call) if e.code == "keypad_flood"]
    assert len(call.of_type(cev.DtmfReceived)) == MAX_GROUP  # the dropped ones cost no event
    dropped = 500 - MAX_GROUP
    assert call.session.calls.keypad_dropped == dropped and len(floods) == 1 + dropped // 100  # the 1st, every 100th
    await asyncio.wait_for(_until(lambda: call.runtime.turns), 5)
    assert call.runtime.last.request.text == f"[the caller pressed {'9' * MAX_GROUP} on the keypad]"


async def _until(condition) -> None:
    while not condition():
        await asyncio.sleep(0.01)


async def test_a_transfer_waits_for_the_agents_line_then_a_failure_is_answered():
    call, control = controlled()
    asked: list[int] = []  # output frames pulled when the door was asked to transfer
    real = control.transfer

    async def transfer(target: str):
        asked.append(len(call.played))
        return await real(target)

    control.transfer = transfer
    send(call, {"type": "session.update", "session": {"tools": [TRANSFER]}})
    await model_calls(call, "transfer_call", '{"target": "sip:desk@example.com"}', "let", "me", "transfer", "you")
    await play_until_idle(call)
    await asyncio.wait_for(_until(lambda: call.of_type(cev.TransferDone)), 5)
    assert asked and call.loud_frames() and max(call.loud_frames()) < asked[0]  # after the agent's line
    assert outputs(call)["call_9"] == {"ok": False, "detail": "busy"}
    # the call goes on with the agent: a response answers the failed transfer
    await asyncio.wait_for(_until(lambda: len(call.runtime.turns) == 2), 5)
    assert call.runtime.last.request.tool_outputs[0].speak
