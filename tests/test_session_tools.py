"""Function calling in a session (duplex/session/realtime/tools.py), in process against a scripted runtime:
tools declared and checked, a model's call announced as Realtime events, the client's result
carried to the next request and answered, a barge-in fencing a pending call, bad input refused
with an error event while the call goes on."""

from __future__ import annotations

import json

from duplex.runtime.contract import ToolCallDelta, ToolCallDone, ToolOutput, ToolSpec
from duplex.session.protocol import MAX_EVENT_BYTES, handle_client_message
from duplex.session.realtime import events as ev
from duplex.session.realtime import tool_events as tev
from tests.session_fakes import Call
from tests.test_session_call import ask, play_until_idle

SCHEMA = {"type": "object", "properties": {"drink": {"type": "string"}}, "required": ["drink"]}
PLACE_ORDER = {"type": "function", "name": "place_order", "description": "Send the order.", "parameters": SCHEMA,
               "strict": True}


def send(call: Call, event: dict | str) -> None:
    handle_client_message(call.session, event if isinstance(event, str) else json.dumps(event), "model")


def errors(call: Call) -> list[ev.ErrorDetail]:
    return [e.error for e in call.of_type(ev.ErrorEvent)]


async def called(call: Call, arguments: str = '{"drink": "taro"}') -> str:
    """Declare the tool, ask, and have the model call it (in two pieces); returns the call id."""
    send(call, {"type": "session.update", "session": {"tools": [PLACE_ORDER], "tool_choice": "place_order"}})
    await ask(call)
    turn = call.runtime.last
    half = len(arguments) // 2
    turn._put(ToolCallDelta("call_1", "place_order", ""))
    turn._put(ToolCallDelta("call_1", "place_order", arguments[:half]))
    turn._put(ToolCallDelta("call_1", "place_order", arguments[half:]))
    turn._put(ToolCallDone("call_1", "place_order", arguments))
    turn.complete()
    await play_until_idle(call)
    return "call_1"


async def test_declared_tools_ride_on_every_request_and_are_described():
    call = Call()
    send(call, {"type": "session.update", "session": {"tools": [PLACE_ORDER], "tool_choice": "required"}})
    described = call.of_type(ev.SessionUpdated)[-1].session
    assert described["tools"][0]["name"] == "place_order" and described["tool_choice"] == "required"
    await ask(call)
    request = call.runtime.last.request
    assert request.tools == [ToolSpec("place_order", "Send the order.", SCHEMA, strict=True)]
    assert request.tool_choice == "required" and request.tool_outputs == []


async def test_a_models_call_becomes_function_call_events_and_is_listed_in_response_done():
    call = Call()
    await called(call)
    kinds = [t for t in call.types() if "function_call" in t or t.startswith("response.output_item")]
    assert kinds == ["response.output_item.added", "response.output_item.added",
                     "response.function_call_arguments.delta", "response.function_call_arguments.delta",
                     "response.function_call_arguments.done", "response.output_item.done"]
    added = call.of_type(tev.CallItemAdded)[0]
    assert (added.output_index, added.item.type, added.item.call_id, added.item.name, added.item.status) == (
        1, "function_call", "call_1", "place_order", "in_progress")
    assert "".join(d.delta for d in call.of_type(tev.ArgumentsDelta)) == '{"drink": "taro"}'
    done = call.of_type(ev.ResponseDone)[-1].response
    assert done.status == "completed"
    assert [(o.type, getattr(o, "arguments", None)) for o in done.output] == [
        ("message", None), ("function_call", '{"drink": "taro"}')]


async def test_the_clients_result_goes_to_the_next_request_and_is_answered():
    call = Call()
    call_id = await called(call)
    send(call, {"type": "conversation.item.create", "item": {"type": "function_call_output", "call_id": call_id,
                                                             "output": '{"order": 42}'}})
    added = call.of_type(tev.OutputItemAdded)[-1]
    assert added.item.call_id == call_id and added.previous_item_id == call.of_type(tev.CallItemAdded)[0].item.id
    send(call, {"type": "response.create"})
    request = call.runtime.last.request
    assert request.tool_outputs == [ToolOutput(call_id, '{"order": 42}', speak=True)]
    call.runtime.last.say("order", "placed")
    call.runtime.last.complete()
    await play_until_idle(call)
    assert call.of_type(ev.ResponseDone)[-1].response.output[0].content[0].transcript == "order placed"
    send(call, {"type": "response.create"})  # the result is not carried twice
    assert call.runtime.last.request.tool_outputs == []


async def test_a_barge_in_while_a_call_is_pending_fences_it():
    call = Call()
    call_id = await called(call)
    await ask(call, "actually never mind")  # the caller speaks while the call waits for its result
    call.runtime.last.complete()
    await play_until_idle(call)
    send(call, {"type": "conversation.item.create", "item": {"type": "function_call_output", "call_id": call_id,
                                                             "output": '{"order": 42}'}})
    assert [e.call_id for e in call.of_type(tev.OutputFenced)] == [call_id]
    send(call, {"type": "response.create"})
    # the late result joins the history, marked so that no reply answers it
    assert call.runtime.last.request.tool_outputs == [ToolOutput(call_id, '{"order": 42}', speak=False)]


async def test_bad_tool_input_is_an_error_event_and_the_call_goes_on():
    call = Call()
    not_a_schema = {**PLACE_ORDER, "parameters": {"type": "object", "properties": {"drink": {"type": 7}}}}
    send(call, {"type": "session.update", "session": {"tools": [not_a_schema]}})
    send(call, {"type": "session.update", "session": {"tools": [PLACE_ORDER], "tool_choice": "send_pizza"}})
    send(call, {"type": "session.update", "session": {"tools": [{**PLACE_ORDER, "parameters": {"type": "string"}}]}})
    first, second, third = errors(call)
    assert first.code == "invalid_session_settings"
    assert "tools[0] (place_order).parameters is not a valid JSON Schema at properties/drink/type" in first.message
    assert "tool_choice 'send_pizza'" in second.message and "['place_order']" in second.message
    assert "must be an object schema" in third.message
    assert call.session.tools.specs == []  # refused updates change nothing
    call_id = await called(call)
    send(call, {"type": "conversation.item.create", "item": {"type": "function_call_output", "call_id": "call_x",
                                                             "output": "{}"}})
    assert errors(call)[-1].code == "invalid_function_call_output"
    assert "unknown call_id 'call_x'" in errors(call)[-1].message
    huge = json.dumps({"type": "conversation.item.create", "item": {
        "type": "function_call_output", "call_id": call_id, "output": "x" * 2**20}})
    send(call, huge)
    assert errors(call)[-1].code == "event_too_large" and str(MAX_EVENT_BYTES) in errors(call)[-1].message
    send(call, {"type": "conversation.item.create", "item": {"type": "function_call_output", "call_id": call_id,
                                                             "output": "ok"}})
    send(call, {"type": "conversation.item.create", "item": {"type": "function_call_output", "call_id": call_id,
                                                             "output": "again"}})
    assert "already answered" in errors(call)[-1].message
    send(call, {"type": "response.create"})
    assert call.runtime.last.request.tool_outputs == [ToolOutput(call_id, "ok")]
