"""A tool call round trip over the Realtime WebSocket with the official ``openai`` SDK: the engine
pipeline (`duplex serve --config engine`) on a real vLLM (its CPU build, scripts/setup_vllm.sh),
a typed order, a forced strict function call, the client's ``function_call_output``, and the
reply to it, in text only. The door has no tool code of its own: it forwards what the session
emits. No assertion depends on what the model says, only on the protocol and the schema."""

from __future__ import annotations

import asyncio
import json
import time

import jsonschema
import pytest

from duplex.models.local import assets
from duplex_tools.harness import ServerProcess
from duplex_tools.vllm import VLLMServer, vllm_available
from duplex_tools.ws_client import WsCaller

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]
ORDER_SCHEMA = {"type": "object", "additionalProperties": False, "required": ["drink", "size"],
                "properties": {"drink": {"type": "string", "enum": ["taro", "matcha", "mango"]},
                               "size": {"type": "string", "enum": ["regular", "large"]}}}
PLACE_ORDER = {"type": "function", "name": "place_order", "description": "Send the order to the shop.",
               "parameters": ORDER_SCHEMA, "strict": True}


@pytest.fixture(scope="module")
def server():
    missing = vllm_available()
    if missing:
        pytest.fail(missing)
    assets.prepare_all()
    with VLLMServer(assets.prepare_gemma()) as engine, ServerProcess(
            ["--config", "engine", "--llm", engine.base_url, "--llm-model", engine.model, "--port", "0",
             "--max-sessions", "2", "--thinker.args.max_new_tokens", "24", "--thinker.args.stall_timeout_s", "120"],
            ready_timeout=300) as proc:
        yield proc
    assert proc.stop() == 0, "".join(proc.output[-30:])


async def _done(caller: WsCaller, response_id: str, timeout: float):
    deadline = time.monotonic() + timeout
    while True:
        for event in caller.of_type("response.done"):
            if event.response.id == response_id:
                return event
        await caller.wait("response.done", timeout=max(0.01, deadline - time.monotonic()), after=time.monotonic())


async def _arguments(caller: WsCaller, server: ServerProcess, response_id: str, timeout: float):
    """The call's finished arguments; a response that ends (or an error) before them fails the
    test at once, with what the server said, rather than after the whole timeout."""
    waits = {asyncio.ensure_future(caller.wait(kind, timeout=timeout)) for kind in ("response.done", "error")}
    arguments = asyncio.ensure_future(caller.wait("response.function_call_arguments.done", timeout=timeout,
                                                  response_id=response_id))
    try:
        await asyncio.wait({arguments, *waits}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in (arguments, *waits):
            wait.cancel()
        await asyncio.gather(arguments, *waits, return_exceptions=True)
    # read from the events, not the task: the server sends the arguments before response.done,
    # and both may arrive in one wake-up, before the arguments' task has run
    for event in caller.of_type("response.function_call_arguments.done"):
        if event.response_id == response_id:
            return event
    kinds = [e.type for _, e in caller.events]
    pytest.fail(f"no function call arguments (response.done: {caller.of_type('response.done')}, errors: "
                f"{caller.of_type('error')}, events: {kinds}); server output:\n" + "".join(server.output[-40:]))


async def test_a_forced_tool_call_round_trip_over_the_sdk(server):
    async with WsCaller(server.url, stream=False) as caller:
        await caller.conn.session.update(session={"type": "realtime", "output_modalities": ["text"],
                                                  "tools": [PLACE_ORDER], "tool_choice": "place_order"})
        await caller.wait("session.updated")
        await caller.conn.conversation.item.create(item={"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "A large taro milk tea, please."}]})
        await caller.conn.response.create()
        response = (await caller.wait("response.created")).response
        args = await _arguments(caller, server, response.id, timeout=300)
        jsonschema.validate(json.loads(args.arguments), ORDER_SCHEMA)
        deltas = "".join(e.delta for e in caller.of_type("response.function_call_arguments.delta")
                         if e.call_id == args.call_id)
        assert deltas == args.arguments
        done = await _done(caller, response.id, timeout=120)
        assert done.response.status == "completed", done
        calls = [item for item in done.response.output if item.type == "function_call"]
        assert [c.call_id for c in calls] == [args.call_id] and calls[0].name == "place_order"

        await caller.conn.conversation.item.create(item={"type": "function_call_output", "call_id": args.call_id,
                                                         "output": json.dumps({"order": 42})})
        await caller.conn.session.update(session={"type": "realtime", "tool_choice": "none"})  # now answer
        await caller.wait("session.updated", after=caller.time_of(done))
        await caller.conn.response.create()
        answer = (await caller.wait("response.created", after=caller.time_of(done))).response
        answered = await _done(caller, answer.id, timeout=300)
        assert answered.response.status == "completed", answered
        assert answered.response.output_modalities == ["text"]
        text = "".join(e.delta for e in caller.of_type("response.output_text.delta") if e.response_id == answer.id)
        assert text.strip(), "no reply to the function's output"
        assert not caller.audio
