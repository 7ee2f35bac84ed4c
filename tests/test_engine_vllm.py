"""The engine thinker against a real vLLM (its CPU build, started once for this module on the
Gemma 3 270M folder the local pipeline converts; scripts/setup_vllm.sh installs it), first as a
stage in process, then behind a real server called over WebRTC. The last test kills the engine:
keep it last.

Token budgets stay small (vLLM on 2 shared cores); no assertion depends on what the model says
or how fast, only on what the engine and the server report."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import jsonschema
import numpy as np
import pytest

from duplex.audio import resample
from duplex.config.pipeline import StageConfig
from duplex.config.session import BargeInConfig
from duplex.models.engine.client import EngineClient, EngineSettings
from duplex.models.engine.thinker import EngineThinker, ThinkerSettings
from duplex.models.local import assets
from duplex.models.local.asr import WhisperTranscriber
from duplex.models.local.prompt import BUBBLE_TEA_ASR_HINT
from duplex.runtime.contract import AgentText, ToolCallDone, ToolSpec, Transcript, TurnRequest, WorkItem
from duplex.runtime.schedulers.stream import StreamScheduler
from duplex_tools.client import RealtimeClient
from duplex_tools.harness import ServerProcess
from duplex_tools.probes import ask, hear
from duplex_tools.vllm import VLLMServer, vllm_available
from tests.engine_helpers import engine_yaml_args, inputs_of
from tests.local_helpers import INTERRUPTION, ORDER, speak, voiced_ms

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

ORDER_SCHEMA = {"type": "object", "additionalProperties": False, "required": ["drink", "size"],
                "properties": {"drink": {"type": "string", "enum": ["taro", "matcha", "mango"]},
                               "size": {"type": "string", "enum": ["regular", "large"]}}}
PLACE_ORDER = {"type": "function", "name": "place_order", "description": "Send the order to the shop.",
               "parameters": ORDER_SCHEMA, "strict": True}
LONG_REPLY = 160  # tokens: the served pipeline's replies run to this (no stop), ~40 s of speech


@pytest.fixture(scope="module")
def vllm():
    missing = vllm_available()
    if missing:
        pytest.fail(missing)
    assets.prepare_all()
    with VLLMServer(assets.prepare_gemma()) as engine:
        yield engine


def _thinker(vllm: VLLMServer, **settings) -> EngineThinker:
    args = engine_yaml_args()
    client = EngineClient(EngineSettings(base_url=vllm.base_url, model=vllm.model, stall_timeout_s=60,
                                         extra_body=args["extra_body"]))
    return EngineThinker(client, ThinkerSettings(system=args["system"], stop=tuple(args["stop"]), **settings))


async def _wait(condition, timeout: float, what: str) -> float:
    """Poll ``condition`` (an engine's /metrics: no event to wait on) until true; seconds taken."""
    started = time.monotonic()
    while not await asyncio.to_thread(condition):
        assert time.monotonic() - started < timeout, f"{what} not within {timeout} s"
        await asyncio.sleep(0.02)
    return time.monotonic() - started


# -- the stage, in process, against vLLM ---------------------------------------------------------
async def test_a_reply_streams_from_vllm(vllm):
    t = _thinker(vllm, max_new_tokens=24)
    request = TurnRequest(session_id="s-reply")
    outputs = [o async for o in t.run("r1", request, inputs_of(request, "Can I get a taro milk tea?"))]
    assert outputs and all(isinstance(o, AgentText) for o in outputs)
    assert "".join(o.text for o in outputs).strip()
    assert "\n" not in "".join(o.text for o in outputs)  # the config's stop: one line per turn


async def test_two_turns_of_one_call_reuse_the_engine_prefix(vllm):
    t = _thinker(vllm, max_new_tokens=8)
    # a system prompt no other request used, so the first turn cannot hit the cache at all
    t.settings = ThinkerSettings(system=f"Call {time.time_ns()}. " + engine_yaml_args()["system"],
                                 max_new_tokens=8, stop=("\n",))
    hits = [vllm.prefix_cache_hits()]
    for rid, line in (("r1", "Hi there."), ("r2", "Can I get a mango tea?")):
        request = TurnRequest(session_id="s-prefix")
        [o async for o in t.run(rid, request, inputs_of(request, line, rid))]
        hits.append(vllm.prefix_cache_hits())
    first, second = hits[1] - hits[0], hits[2] - hits[1]
    assert first == 0, f"the first turn hit {first} cached tokens"
    assert second >= 128, f"the second turn reused only {second} tokens (a block is 128 here)"


async def test_abort_ends_the_engine_request_within_a_second(vllm):
    stage = StageConfig(name="thinker", builder="engine.thinker", scheduler="stream")
    sched = StreamScheduler(stage, _thinker(vllm, max_new_tokens=400))
    sched.runner.settings = ThinkerSettings(system="Tell a long story.", max_new_tokens=400)  # no stop: it runs on
    sched.start()
    try:
        request = TurnRequest(session_id="s-abort")
        sched.inbox.put(WorkItem("ra", "asr", Transcript("Once upon a time", final=True), True, request))
        while not any(isinstance(e.data, AgentText) for e in sched.outbox.drain()):
            await asyncio.sleep(0.01)
        assert vllm.running_requests() == 1
        sched.abort("ra")
        took = await _wait(lambda: vllm.running_requests() == 0, 1.0, "vLLM's running requests at 0")
        assert took <= 1.0 and not sched.live_requests() and sched.resources()["open_streams"] == 0
    finally:
        sched.stop()


async def test_a_forced_strict_tool_call_gives_schema_valid_arguments(vllm):
    t = _thinker(vllm)
    spec = ToolSpec("place_order", PLACE_ORDER["description"], ORDER_SCHEMA, strict=True)
    request = TurnRequest(session_id="s-tool", tools=[spec], tool_choice="place_order")
    outputs = [o async for o in t.run("r1", request, inputs_of(request, "A large taro please."))]
    done = [o for o in outputs if isinstance(o, ToolCallDone)]
    assert len(done) == 1 and done[0].name == "place_order"
    jsonschema.validate(json.loads(done[0].arguments), ORDER_SCHEMA)


# -- a served pipeline over WebRTC -------------------------------------------------------------
@pytest.fixture(scope="module")
def server(vllm):
    # No stop at the line break: the base model writes the scene on (Customer: ... Mia: ...) up to
    # LONG_REPLY tokens, so a barge-in 0.1 s into the first phrase lands while vLLM still generates
    # (the barge-in test checks that it does). vLLM's min_tokens would guarantee it, but it fights
    # a forced call's JSON grammar (no end token allowed after the closing brace).
    args = ["--config", "engine", "--llm", vllm.base_url, "--llm-model", vllm.model, "--port", "0",
            "--ice-loopback", "--max-sessions", "2", "--thinker.args.stop", "[]",
            "--thinker.args.max_new_tokens", str(LONG_REPLY), "--thinker.args.stall_timeout_s", "120"]
    with ServerProcess(args, ready_timeout=300) as proc:
        yield proc
    assert proc.stop() == 0, "".join(proc.output[-30:])


@pytest.fixture(scope="module")
def voices() -> dict[str, np.ndarray]:
    # made before any call: synthesis inside a test would stall the client's event loop
    made = {"order": speak(ORDER, rate=48000), "stop": speak(INTERRUPTION, rate=48000),
            "hello": speak("Hello there.", rate=48000)}
    assert voiced_ms(made["stop"], 48000) >= 2 * BargeInConfig().interrupt_ms, "the cut must not wait on words"
    return made


async def _stats(url: str) -> dict:
    async with httpx.AsyncClient(base_url=url, timeout=10) as http:
        return (await http.get("/duplex/stats")).json()


async def _idle(url: str, timeout: float = 15.0) -> None:
    started = time.monotonic()
    while True:
        stages = (await _stats(url))["stages"]
        if all(v["live_requests"] == 0 and not any(v["resources"].values()) for v in stages.values()):
            return
        assert time.monotonic() - started < timeout, f"stages still hold state: {stages}"
        await asyncio.sleep(0.05)


def _transcribe(pcm: np.ndarray) -> str:
    whisper = WhisperTranscriber(assets.prepare_whisper(), hint=BUBBLE_TEA_ASR_HINT)
    return whisper.transcribe([resample(pcm, 48000, 16000)[: 30 * 16000]], 3000)[0]


async def _done(client: RealtimeClient, response_id: str, timeout: float = 30.0) -> dict:
    """The response.done of that response (wait_event matches top-level fields only)."""
    started = time.monotonic()
    while True:
        for event in client.of_type("response.done"):
            if event["response"]["id"] == response_id:
                return event
        left = timeout - (time.monotonic() - started)
        assert left > 0, f"no response.done for {response_id}"
        await client.wait_event("response.done", timeout=left, after=time.monotonic())


async def _cancel(client: RealtimeClient, response_id: str) -> None:
    """Stop a playing reply (its generation may have completed already: then only the audio stops)."""
    sent = time.monotonic()
    client.send({"type": "response.cancel"})
    await client.wait_event("output_audio_buffer.cleared", timeout=30, after=sent, response_id=response_id)
    done = await _done(client, response_id)
    assert done["response"]["status"] in ("cancelled", "completed"), done


@pytest.mark.usefixtures("loopback_candidates")
async def test_a_spoken_order_gets_a_spoken_reply(server, voices):
    client = RealtimeClient(server.url)
    await client.connect()
    try:
        created = await ask(client, voices["order"], timeout=60)
        response_id = created["response"]["id"]
        transcript = await client.wait_event("conversation.item.input_audio_transcription.completed", timeout=60)
        assert "bubble tea" in transcript["transcript"].lower(), transcript
        started = await client.wait_event("output_audio_buffer.started", timeout=120, response_id=response_id)
        await hear(client, client.time_of(started), 4.0, timeout=60)
        reply = np.concatenate([h.pcm for h in client.heard if h.at >= client.time_of(started) - 0.1])
        heard = _transcribe(reply)
        assert len(heard.split()) >= 3, f"the agent's reply was heard as {heard!r}"
        await _cancel(client, response_id)
        await _idle(server.url)
    finally:
        await client.hang_up()


@pytest.mark.usefixtures("loopback_candidates")
async def test_barge_in_ends_the_engine_request_and_frees_every_stage(server, vllm, voices):
    client = RealtimeClient(server.url)
    # silence-ended turns: the interruption ("Wait, stop. I want ...", pauses of 320 and 240 ms) is
    # one turn whatever Smart Turn makes of its pauses, so its one reply is the one cancelled below
    await client.connect(session={"turn_detection": {"type": "server_vad"}})
    try:
        created = await ask(client, voices["order"], timeout=60)
        response_id = created["response"]["id"]
        started = await client.wait_event("output_audio_buffer.started", timeout=120, response_id=response_id)
        await hear(client, client.time_of(started), 0.1, timeout=30)
        assert vllm.running_requests() == 1, "the reply should still be generating"
        client.mic.play(voices["stop"])
        judged = await client.wait_event("duplex.overlap.judged", timeout=20, after=client.time_of(started),
                                         response_id=response_id)
        assert judged["kind"] == "interruption", judged
        onset = await client.wait_event("input_audio_buffer.speech_started", timeout=20, after=client.time_of(started))
        took = await _wait(lambda: vllm.running_requests() == 0, 3.0, "vLLM's running requests at 0")
        done = await _done(client, response_id)
        assert done["response"]["status"] == "cancelled", done
        # from the server's barge-in (the client got its speech_started) to the engine holding nothing
        assert took <= 1.0, f"vLLM still ran the request {took:.2f} s after the barge-in was seen"
        # the interruption is a turn of its own: cancel its reply, then nothing may be held
        second = await client.wait_event("response.created", timeout=60, after=client.time_of(onset))
        await client.wait_event("output_audio_buffer.started", timeout=120, response_id=second["response"]["id"])
        await _cancel(client, second["response"]["id"])
        await _wait(lambda: vllm.running_requests() == 0, 1.0, "vLLM's running requests at 0")
        await _idle(server.url)
    finally:
        await client.hang_up()


@pytest.mark.usefixtures("loopback_candidates")
async def test_a_forced_tool_call_is_answered_by_the_client_and_spoken(server, voices):
    client = RealtimeClient(server.url)
    await client.connect(ignore_max_message_size=True)  # so it can send the over-size output below
    try:
        client.send({"type": "session.update", "session": {"tools": [PLACE_ORDER], "tool_choice": "place_order"}})
        updated = await client.wait_event("session.updated", timeout=10)
        assert updated["session"]["tool_choice"] == "place_order"
        created = await ask(client, voices["order"], timeout=60)
        response_id = created["response"]["id"]
        try:
            added = await client.wait_event("response.output_item.added", timeout=180, response_id=response_id,
                                            output_index=1)
        except TimeoutError:
            raise AssertionError(f"no function call; errors: {client.of_type('error')}") from None
        assert added["item"]["type"] == "function_call" and added["item"]["name"] == "place_order"
        call_id = added["item"]["call_id"]
        args = await client.wait_event("response.function_call_arguments.done", timeout=120, call_id=call_id)
        jsonschema.validate(json.loads(args["arguments"]), ORDER_SCHEMA)
        deltas = [e["delta"] for e in client.of_type("response.function_call_arguments.delta")]
        assert "".join(deltas) == args["arguments"]
        done = await _done(client, response_id, timeout=60)
        assert done["response"]["status"] == "completed", done
        assert [o["type"] for o in done["response"]["output"]] == ["message", "function_call"]
        # bad input first: each an error event, the call goes on
        client.send({"type": "conversation.item.create", "item": {"type": "function_call_output",
                                                                  "call_id": "call_nope", "output": "{}"}})
        error = await client.wait_event("error", timeout=10, after=client.time_of(done))
        assert "unknown call_id 'call_nope'" in error["error"]["message"]
        # the server's answer advertises a 64 KiB max-message-size (honest peers send nothing larger);
        # a peer that disregards it meets the session's own limit on one event (64 KiB)
        client.send(json.dumps({"type": "conversation.item.create", "item": {
            "type": "function_call_output", "call_id": call_id, "output": "x" * 200_000}}))
        big = await client.wait_event("error", timeout=10, after=client.time_of(error) + 1e-6)
        assert big["error"]["code"] == "event_too_large"
        client.send({"type": "session.update", "session": {"tools": [
            {**PLACE_ORDER, "parameters": {"type": "object", "properties": {"size": {"type": 12}}}}]}})
        bad = await client.wait_event("error", timeout=10, after=client.time_of(big) + 1e-6)
        assert bad["error"]["code"] == "invalid_session_settings"
        assert "parameters is not a valid JSON Schema at properties/size/type" in bad["error"]["message"]
        # the real answer, then the agent speaks it
        sent_at = time.monotonic()
        client.send({"type": "conversation.item.create", "item": {"type": "function_call_output", "call_id": call_id,
                                                                  "output": json.dumps({"order": 42})}})
        await client.wait_event("conversation.item.added", timeout=10, after=sent_at)
        client.send({"type": "response.create"})
        spoken = await client.wait_event("response.created", timeout=30, after=sent_at)
        began = await client.wait_event("output_audio_buffer.started", timeout=120,
                                        response_id=spoken["response"]["id"])
        await hear(client, client.time_of(began), 1.0, timeout=60)
        await _cancel(client, spoken["response"]["id"])
        await _idle(server.url)
    finally:
        await client.hang_up()


@pytest.mark.usefixtures("loopback_candidates")
async def test_the_engine_killed_mid_call_fails_that_call_and_the_next_clearly(server, vllm, voices):
    """Kills the module's vLLM: the last test here."""
    client = RealtimeClient(server.url)
    await client.connect()
    try:
        created = await ask(client, voices["order"], timeout=60)
        response_id = created["response"]["id"]
        await client.wait_event("response.output_audio_transcript.delta", timeout=120, response_id=response_id)
        killed_at = time.monotonic()
        vllm.kill()
        error = await client.wait_event("error", timeout=30, after=killed_at)
        assert f"engine {vllm.base_url} ({vllm.model})" in error["error"]["message"], error
        done = await _done(client, response_id)
        assert done["response"]["status"] == "failed", done
    finally:
        await client.hang_up()
    client = RealtimeClient(server.url)  # the next call: told at once, no hang
    await client.connect()
    try:
        started = time.monotonic()
        await ask(client, voices["hello"], timeout=60)
        error = await client.wait_event("error", timeout=30, after=started)
        assert "cannot connect" in error["error"]["message"] and vllm.base_url in error["error"]["message"], error
        await _idle(server.url)
    finally:
        await client.hang_up()
