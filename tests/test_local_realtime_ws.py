"""The default pipeline (configs/local.yaml: Whisper, Gemma 3 270M, Piper) over the Realtime
WebSocket with the official ``openai`` SDK: a spoken order streamed as base64 PCM 24 kHz in real
time, and the reply's ``response.output_audio.delta`` audio is speech Whisper understands; then a
typed message in the same conversation gets a text-only reply from the same thinker."""

from __future__ import annotations

import time

import numpy as np
import pytest

from duplex.audio import resample
from duplex.models.local import assets
from duplex.models.local.asr import WhisperTranscriber
from duplex.models.local.prompt import BUBBLE_TEA_ASR_HINT
from duplex_tools.harness import ServerProcess
from duplex_tools.ws_client import RATE, WsCaller
from tests.local_helpers import ORDER, speak, word_recall

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def server():
    assets.prepare_all()
    with ServerProcess(["--port", "0", "--max-sessions", "2"], ready_timeout=300) as proc:
        yield proc
    assert proc.stop() == 0, "".join(proc.output[-30:])


async def _done(caller: WsCaller, response_id: str, timeout: float):
    deadline = time.monotonic() + timeout
    while True:
        for event in caller.of_type("response.done"):
            if event.response.id == response_id:
                return event
        await caller.wait("response.done", timeout=max(0.01, deadline - time.monotonic()), after=time.monotonic())


async def test_a_spoken_order_over_the_websocket_gets_a_reply_whisper_understands(server):
    order = np.concatenate([speak(ORDER, rate=RATE), np.zeros(RATE, np.float32)])
    async with WsCaller(server.url, model="gpt-realtime") as caller:
        caller.say(order)
        transcript = await caller.wait("conversation.item.input_audio_transcription.completed", timeout=60)
        assert "bubble tea" in transcript.transcript.lower(), transcript
        response = (await caller.wait("response.created", timeout=60)).response
        done = await _done(caller, response.id, timeout=180)
        assert done.response.status == "completed", done
        said = next(e.transcript for e in caller.of_type("response.output_audio_transcript.done")
                    if e.response_id == response.id)
        reply = caller.audio_of(response.id)
        assert len(reply) > RATE // 2, "less than half a second of reply audio"
        heard = WhisperTranscriber(assets.prepare_whisper(), hint=BUBBLE_TEA_ASR_HINT).transcribe(
            [resample(reply, RATE, 16000)[: 30 * 16000]], 3000)[0]
        assert word_recall(said, heard) >= 0.5, f"the reply {said!r} was heard as {heard!r}"

        await caller.conn.conversation.item.create(item={"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "Do you have mango tea?"}]})
        await caller.conn.response.create(response={"output_modalities": ["text"]})
        typed = (await caller.wait("response.created", after=caller.time_of(done))).response
        typed_done = await _done(caller, typed.id, timeout=120)
        assert typed_done.response.status == "completed"
        text = "".join(e.delta for e in caller.of_type("response.output_text.delta") if e.response_id == typed.id)
        assert text.strip(), "the thinker wrote nothing for the typed message"
        assert not caller.audio_of(typed.id).size
