"""The engine thinker's stage against a tiny real HTTP server (tests/engine_helpers.py): text
streaming, the stable conversation prefix, the heard cut after an abort, every error path
(refused, 4xx/5xx, a stalled stream, malformed chunks, oversized tool arguments: each a clear
error naming the engine, never retried), server-side tools, and the ``stream`` scheduler that
keeps many requests in flight and closes a stream at once on abort."""

from __future__ import annotations

import asyncio
import select
import time

import pytest

from duplex.config.pipeline import StageConfig
from duplex.models.engine.client import EngineClient, EngineError, EngineSettings
from duplex.models.engine.server_tools import ServerTool, ServerTools
from duplex.models.engine.stages import build_thinker
from duplex.models.engine.thinker import EngineThinker, ThinkerSettings
from duplex.runtime.contract import (
    AgentText,
    BuildContext,
    ErrorCode,
    Heard,
    SessionEnd,
    ToolCallDelta,
    ToolCallDone,
    ToolOutput,
    ToolSpec,
    Transcript,
    TurnRequest,
    WorkItem,
)
from duplex.runtime.schedulers.stream import StreamScheduler
from tests.engine_helpers import REPLY, TinyEngine, inputs_of
from tools.duplex_tools.vllm import free_port


@pytest.fixture
def tiny():
    with TinyEngine() as engine:
        yield engine


def thinker(url: str, stall_s: float = 5.0, **settings) -> EngineThinker:
    client = EngineClient(EngineSettings(base_url=url, model="tiny", stall_timeout_s=stall_s))
    return EngineThinker(client, ThinkerSettings(system="You are Mia.", **settings))


async def collect(t: EngineThinker, request: TurnRequest, text: str, rid: str = "r1") -> list:
    return [out async for out in t.run(rid, request, inputs_of(request, text, rid))]


async def test_text_streams_as_deltas_and_the_prefix_stays_the_same(tiny):
    t = thinker(tiny.url("ok"))
    first = await collect(t, TurnRequest(session_id="s1", turn=1), "Hi there", "r1")
    assert [o.text for o in first] == ["Sure,", " one", " taro", " tea."]
    assert all(isinstance(o, AgentText) for o in first)
    await collect(t, TurnRequest(session_id="s1", turn=2), "A large one", "r2")
    sent = [r["messages"] for r in tiny.requests]
    assert sent[0] == [{"role": "system", "content": "You are Mia."}, {"role": "user", "content": "Hi there"}]
    # turn 2 starts with exactly turn 1's messages, then the reply as it was said
    assert sent[1][:2] == sent[0]
    assert sent[1][2:] == [{"role": "assistant", "content": "".join(REPLY)}, {"role": "user", "content": "A large one"}]
    assert tiny.requests[0]["stream"] is True


async def test_an_aborted_reply_closes_its_stream_and_keeps_only_what_was_heard(tiny):
    t = thinker(tiny.url("trickle"))
    request = TurnRequest(session_id="s1", turn=1)
    six = asyncio.Event()

    async def consume() -> None:
        said = ""
        async for out in t.run("r1", request, inputs_of(request, "Tell me everything", "r1")):  # " la" / 20 ms
            said += out.text
            if said.count("la") >= 6:
                six.set()

    task = asyncio.get_running_loop().create_task(consume())
    await asyncio.wait_for(six.wait(), 10)
    started = time.monotonic()
    task.cancel()  # the scheduler's abort
    await asyncio.gather(task, return_exceptions=True)
    assert await asyncio.to_thread(tiny.disconnected.wait, 1.0), "the engine did not see the stream closed"
    assert time.monotonic() - started < 1.0
    assert t.held()["open_streams"] == 0
    # the aborted turn waits aside until a later request says what was heard: the first 2 words
    reply = t.conversations.get("s1").interrupted.reply
    assert reply.startswith("la la la la la la")
    t.client = EngineClient(EngineSettings(base_url=tiny.url("ok"), model="tiny"))
    heard = Heard(request_id="r1", audio_end_ms=round(1000 * 5.5 / len(reply)), audio_ms=1000)
    await collect(t, TurnRequest(session_id="s1", turn=2, heard=heard), "Stop", "r2")
    messages = tiny.requests[-1]["messages"]
    assert messages[1:] == [{"role": "user", "content": "Tell me everything"},
                            {"role": "assistant", "content": "la la..."}, {"role": "user", "content": "Stop"}]
    # with the words the caller heard known exactly (the TTS said what each chunk voiced), those
    t.client = EngineClient(EngineSettings(base_url=tiny.url("ok"), model="tiny"))
    await collect(t, TurnRequest(session_id="s1", turn=3), "A taro tea", "r3")  # "Sure, one taro tea."
    exact = Heard(request_id="r3", audio_end_ms=10, audio_ms=5000, text="Sure, one")  # not 10/5000 of it
    await collect(t, TurnRequest(session_id="s1", turn=4, heard=exact), "Again", "r4")
    assert tiny.requests[-1]["messages"][-2] == {"role": "assistant", "content": "Sure, one..."}


@pytest.mark.parametrize("mode, expected", [
    ("status500", "HTTP 500: tiny engine says 500"),
    ("status400", "HTTP 400: tiny engine says 400"),
    ("malformed", "malformed chunk (not JSON)"),
    ("notachunk", "malformed chunk"),
])
async def test_engine_failures_name_the_engine_and_are_not_retried(tiny, mode, expected):
    t = thinker(tiny.url(mode))
    with pytest.raises(EngineError) as failure:
        await collect(t, TurnRequest(session_id="s1"), "Hi there")
    assert f"engine {tiny.url(mode)} (tiny)" in str(failure.value)
    assert expected in str(failure.value)
    assert len(tiny.requests) == 1  # no retry behind the caller's back
    assert t.held()["open_streams"] == 0


async def test_a_stalled_stream_fails_after_the_stall_timeout(tiny):
    t = thinker(tiny.url("stall"), stall_s=0.5)
    started = time.monotonic()
    with pytest.raises(EngineError, match=r"stream stalled: no chunk for 0.5 s"):
        await collect(t, TurnRequest(session_id="s1"), "Hi there")
    assert 0.5 <= time.monotonic() - started < 3.0


async def test_connection_refused_is_a_clear_error():
    url = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    t = thinker(url)
    with pytest.raises(EngineError, match=r"cannot connect"):
        await collect(t, TurnRequest(session_id="s1"), "Hi there")


async def test_megabyte_tool_arguments_fail_the_response(tiny):
    t = thinker(tiny.url("bigargs"))
    request = TurnRequest(session_id="s1", tools=[ToolSpec("place_order", parameters={"type": "object"})],
                          tool_choice="place_order")
    outputs = []
    with pytest.raises(EngineError, match=r"tool call arguments exceed 65536 bytes"):
        async for out in t.run("r1", request, inputs_of(request, "Order it")):
            outputs.append(out)
    assert outputs and all(isinstance(o, ToolCallDelta) for o in outputs)
    assert tiny.requests[0]["tool_choice"] == {"type": "function", "function": {"name": "place_order"}}
    assert "stop" not in tiny.requests[0]  # a forced call's JSON may hold line breaks


async def test_tool_arguments_looping_on_whitespace_fail_the_response_and_close_the_stream(tiny):
    t = thinker(tiny.url("blankargs"))
    request = TurnRequest(session_id="s1", tools=[ToolSpec("place_order", parameters={"type": "object"})],
                          tool_choice="place_order")
    with pytest.raises(EngineError, match=r"ran on in whitespace \(6[5-6] blank characters in a row, more than 64\)"):
        async for _ in t.run("r1", request, inputs_of(request, "Order it")):
            pass
    assert tiny.disconnected.wait(10), "the engine's stream stayed open"


async def test_tool_calls_stream_and_their_results_join_the_history(tiny):
    t = thinker(tiny.url("servercall"))  # place_order is not a server tool here: the client answers it
    tools = [ToolSpec("place_order", "Place the order", {"type": "object"}, strict=True)]
    outputs = await collect(t, TurnRequest(session_id="s1", tools=tools), "One taro please", "r1")
    assert isinstance(outputs[0], ToolCallDelta) and outputs[0].call_id == "call_srv"
    assert outputs[-1] == ToolCallDone("call_srv", "place_order", '{"drink": "taro"}')
    assert tiny.requests[0]["tools"][0]["function"]["strict"] is True
    answer = TurnRequest(session_id="s1", tools=tools, tool_choice="place_order",
                         tool_outputs=[ToolOutput("call_srv", "42")])
    spoken = await collect(t, answer, "", "r2")
    assert "".join(o.text for o in spoken) == "Order 42 is in."
    assert tiny.requests[1]["tool_choice"] == "auto"  # a forced choice applies to the caller's turns only
    assert tiny.requests[1]["messages"][-2:] == [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_srv", "type": "function", "function": {
            "name": "place_order", "arguments": '{"drink": "taro"}'}}]},
        {"role": "tool", "tool_call_id": "call_srv", "content": "42"}]


async def test_a_fenced_result_joins_the_history_but_is_not_answered(tiny):
    t = thinker(tiny.url("servercall"))
    tools = [ToolSpec("place_order", parameters={"type": "object"})]
    await collect(t, TurnRequest(session_id="s1", tools=tools), "One taro please", "r1")
    fenced = TurnRequest(session_id="s1", tools=tools, tool_outputs=[ToolOutput("call_srv", "42", speak=False)])
    assert await collect(t, fenced, "", "r2") == []
    assert len(tiny.requests) == 1  # nothing asked of the engine
    assert t.conversations.get("s1").find_call("call_srv").output == "42"


async def test_server_tools_are_called_and_their_answer_spoken(tiny):
    tools = ServerTools(tools=[ServerTool(name="place_order", url=f"http://127.0.0.1:{tiny.port}/orders")],
                        url_allowlist=[f"http://127.0.0.1:{tiny.port}/"])
    t = EngineThinker(EngineClient(EngineSettings(base_url=tiny.url("servercall"), model="tiny")),
                      ThinkerSettings(), tools)
    spoken = await collect(t, TurnRequest(session_id="s1"), "One taro please")
    assert "".join(o.text for o in spoken) == "Order 42 is in."  # no client tool events: the server made the call
    posted = [r for r in tiny.requests if "messages" not in r]
    assert posted == [{"drink": "taro"}]


async def test_a_failing_server_tool_speaks_its_fallback(tiny):
    tools = ServerTools(tools=[ServerTool(name="place_order", url=f"http://127.0.0.1:{tiny.port}/slow", timeout_s=0.3,
                                          fallback="Sorry, the shop is not answering.")],
                        url_allowlist=[f"http://127.0.0.1:{tiny.port}/"])
    t = EngineThinker(EngineClient(EngineSettings(base_url=tiny.url("servercall"), model="tiny")),
                      ThinkerSettings(), tools)
    spoken = await collect(t, TurnRequest(session_id="s1"), "One taro please")
    assert [o.text for o in spoken] == ["Sorry, the shop is not answering."]
    assert "did not answer within 0.3 s" in t.conversations.get("s1").find_call("call_srv").output


def test_server_tool_urls_must_be_allowlisted():
    ctx = BuildContext(stage="thinker", args={"base_url": "http://127.0.0.1:1/v1", "model": "m", "server_tools": [
        {"name": "place_order", "url": "http://evil.example/orders"}], "url_allowlist": ["http://127.0.0.1:9000/"]})
    with pytest.raises(ValueError, match=r"url 'http://evil.example/orders' is not in url_allowlist"):
        build_thinker(ctx)


def test_the_builder_says_where_the_engine_is_missing(monkeypatch):
    monkeypatch.delenv("DUPLEX_LLM_URL", raising=False)
    with pytest.raises(ValueError, match=r"no engine: set args.base_url and args.model \(duplex serve --llm"):
        build_thinker(BuildContext(stage="thinker", args={}))
    with pytest.raises(ValueError, match=r"stage thinker: max_new_tokns: Extra inputs"):
        build_thinker(BuildContext(stage="thinker", args={"max_new_tokns": 3}))


async def test_session_end_forgets_the_conversation(tiny):
    t = thinker(tiny.url("ok"))
    await collect(t, TurnRequest(session_id="s1"), "Hi there")
    assert len(t.conversations) == 1
    end = SessionEnd(session_id="s1")

    async def eos():
        yield WorkItem("r9", "asr", Transcript("", final=True), True, end)

    assert [o async for o in t.run("r9", end, eos())] == []
    assert len(t.conversations) == 0


# -- the stream scheduler ----------------------------------------------------------------------
def _scheduler(url: str, cap: int = 8, stall_s: float = 5.0) -> StreamScheduler:
    stage = StageConfig(name="thinker", builder="engine.thinker",
                        scheduler={"kind": "stream", "max_running_requests": cap})
    sched = StreamScheduler(stage, thinker(url, stall_s))
    sched.start()
    return sched


def _feed(sched: StreamScheduler, rid: str, text: str) -> None:
    request = TurnRequest(session_id=f"s-{rid}")
    sched.inbox.put(WorkItem(rid, "asr", Transcript(text, final=True), True, request))


def _wait_for(sched: StreamScheduler, done, timeout: float = 10.0) -> list:
    """Drain emits (waiting on the outbox's wake pipe) until ``done(emits)``."""
    emits: list = []
    deadline = time.monotonic() + timeout
    while not done(emits):
        left = deadline - time.monotonic()
        assert left > 0, f"timed out; got {emits}"
        select.select([sched.outbox.wake_fd], [], [], left)
        emits += sched.outbox.drain()
    return emits


def test_scheduler_streams_many_requests_at_once_and_aborts_at_once(tiny):
    sched = _scheduler(tiny.url("trickle"))
    try:
        for rid in ("a", "b", "c", "d"):
            _feed(sched, rid, "Talk")
        emits = _wait_for(sched, lambda es: {e.request_id for e in es} == {"a", "b", "c", "d"})
        assert sched.resources()["streams"] == 4 and sched.resources()["open_streams"] == 4
        started = time.monotonic()
        for rid in ("a", "b", "c", "d"):
            sched.abort(rid)
        while sched.live_requests() or sched.resources()["open_streams"]:
            assert time.monotonic() - started < 1.0, sched.resources()
            time.sleep(0.005)  # polling another thread's state: the test's only way to see it
        _feed(sched, "a", "late input of an aborted request")  # dropped, not a new stream
        assert not sched.live_requests()
        assert all(e.error is None for e in emits)
    finally:
        sched.stop()


def test_scheduler_reports_engine_errors_per_request(tiny):
    sched = _scheduler(tiny.url("status500"))
    try:
        _feed(sched, "x", "Hi")
        emits = _wait_for(sched, lambda es: any(e.error for e in es))
        error = next(e.error for e in emits if e.error)
        assert error.code is ErrorCode.STAGE_FAILED and error.stage == "thinker"
        assert f"engine {tiny.url('status500')} (tiny): HTTP 500" in error.message
        assert not sched.live_requests()
    finally:
        sched.stop()


def test_scheduler_queues_requests_past_its_cap(tiny):
    sched = _scheduler(tiny.url("ok"), cap=1)
    try:
        for rid in ("a", "b", "c"):
            _feed(sched, rid, "Hi")
        emits = _wait_for(sched, lambda es: sum(e.eos for e in es) == 3)
        assert [e.request_id for e in emits if e.eos] == ["a", "b", "c"]
        assert sched.resources() == {"streams": 0, "queued_items": 0, "open_streams": 0}
    finally:
        sched.stop()


def test_serve_llm_flags_become_thinker_overrides_of_the_engine_config():
    from duplex.config import load_pipeline
    from duplex.server.serve import engine_overrides

    config, overrides = engine_overrides(None, "http://10.0.0.5:8001/v1", "Qwen/Qwen3-8B", ["--tts.threads", "1"])
    assert config == "engine" and overrides[:2] == ["--tts.threads", "1"]
    thinker = next(s for s in load_pipeline(config, overrides).stages if s.name == "thinker")
    assert (thinker.args["base_url"], thinker.args["model"]) == ("http://10.0.0.5:8001/v1", "Qwen/Qwen3-8B")
    assert engine_overrides(None, None, None, []) == ("local", [])
    with pytest.raises(ValueError, match="--llm needs --llm-model"):
        engine_overrides(None, "http://h:1/v1", None, [])
    with pytest.raises(ValueError, match="--llm-model needs --llm"):
        engine_overrides(None, None, "m", [])
    with pytest.raises(ValueError, match="expected the engine's base URL"):
        engine_overrides(None, "h:1", "m", [])
