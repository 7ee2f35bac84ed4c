"""`duplex model asr-server`: the local recogniser over Wyoming, as a real server process reached by
duplex's own Wyoming ASR stage (the one `duplex serve --asr tcp://...` uses) and by a raw Wyoming
client; then its batching in process. Waits are bounded polls and timeouts are hang guards: no
assertion depends on how fast this CPU is."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from wyoming.asr import Transcript as WyomingTranscript
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.info import Describe, Info

from duplex.models.local import assets
from duplex.models.local.asr import SAMPLE_RATE, StreamingPolicy, WhisperTranscriber
from duplex.models.local.asr_server import BatchedTranscriber
from duplex.models.local.prompt import BUBBLE_TEA_ASR_HINT
from duplex.models.speech.asr import ASRSettings, WyomingASR
from duplex.models.speech.client import parse_url
from duplex.runtime.contract import Transcript, TurnRequest
from duplex_tools.speech_servers import WyomingServer
from tests.local_helpers import ORDER, caller_audio, chunks, silence, speak, word_recall
from tests.test_wyoming_stages import _audio, _collect

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
GUARD_S = 60  # a hang guard per server answer


@pytest.fixture(scope="module")
def server():
    with WyomingServer.duplex_whisper(BUBBLE_TEA_ASR_HINT) as asr:
        yield asr


def _pcm(samples: np.ndarray) -> bytes:
    return (np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes()


async def _ask(url: str, events: list) -> object:
    """Send ``events`` on a new connection; the server's first answer (None if it hung up)."""
    _, host, port = url.replace("//", "").split(":")
    async with AsyncTcpClient(host, int(port)) as client:
        for event in events:
            await client.write_event(event.event())
        return await asyncio.wait_for(client.read_event(), GUARD_S)


async def test_the_asr_stage_hears_an_order_through_the_server(server):
    asr = WyomingASR(parse_url(server.url, "asr server"), ASRSettings())
    request = TurnRequest(session_id="a1")
    pieces = caller_audio(chunks(np.concatenate([silence(0.2), speak(ORDER), silence(0.4)])))
    out = await _collect(asr.run("r1", request, _audio(request, pieces)))
    assert isinstance(out[-1], Transcript) and out[-1].final
    assert word_recall(ORDER, out[-1].text) >= 0.85, out[-1].text
    assert asr.held()["open_streams"] == 0


async def test_it_describes_itself_and_hears_8_khz_audio(server):
    info = await _ask(server.url, [Describe()])
    assert Info.is_type(info.type)
    assert [m.languages for p in Info.from_event(info).asr for m in p.models] == [["en"]]
    speech = speak(ORDER, rate=8000)
    answer = await _ask(server.url, [AudioStart(rate=8000, width=2, channels=1),
                                     AudioChunk(rate=8000, width=2, channels=1, audio=_pcm(speech)), AudioStop()])
    assert WyomingTranscript.is_type(answer.type)
    assert word_recall(ORDER, WyomingTranscript.from_event(answer).text) >= 0.85


@pytest.mark.parametrize("chunk, words", [
    (AudioChunk(rate=16000, width=4, channels=1, audio=b"\0" * 64), "width 4"),
    (AudioChunk(rate=3, width=2, channels=1, audio=b"\0" * 64), "3 Hz"),
])
async def test_bad_audio_is_an_error_naming_it_and_other_callers_go_on(server, chunk, words):
    answer = await _ask(server.url, [AudioStart(rate=chunk.rate, width=chunk.width, channels=1), chunk])
    assert Error.is_type(answer.type) and words in Error.from_event(answer).text
    ok = await _ask(server.url, [AudioStart(rate=16000, width=2, channels=1),
                                 AudioChunk(rate=16000, width=2, channels=1, audio=_pcm(speak("Wait, stop."))),
                                 AudioStop()])
    assert WyomingTranscript.is_type(ok.type) and "stop" in WyomingTranscript.from_event(ok).text.lower()


async def test_too_much_audio_in_one_request_is_refused():
    with WyomingServer.duplex_whisper(max_audio_s=1.0) as short:
        answer = await _ask(short.url, [AudioStart(rate=16000, width=2, channels=1),
                                        AudioChunk(rate=16000, width=2, channels=1, audio=_pcm(silence(1.5)))])
    assert Error.is_type(answer.type) and "more than 1 s" in Error.from_event(answer).text


# -- batching, in process -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def transcriber() -> WhisperTranscriber:
    return WhisperTranscriber(assets.prepare_whisper(), threads=2, hint=BUBBLE_TEA_ASR_HINT)


async def test_requests_of_one_window_length_share_one_model_call(transcriber):
    model = BatchedTranscriber(transcriber, StreamingPolicy())
    worker = asyncio.create_task(model.run())
    try:
        order, stop = speak(ORDER), speak("Wait, stop.")
        stop = np.concatenate([stop, silence((len(order) - len(stop)) / SAMPLE_RATE)])  # the same window
        heard = await asyncio.wait_for(asyncio.gather(model.transcribe(order), model.transcribe(stop)), GUARD_S)
        assert model.calls == 1
        assert word_recall(ORDER, heard[0]) >= 0.85 and "stop" in heard[1].lower()
        long = np.concatenate([order, silence(30.0 - len(order) / SAMPLE_RATE), order])  # past one window
        text = await asyncio.wait_for(model.transcribe(long), GUARD_S)
        assert model.calls == 3 and word_recall(ORDER, text) >= 0.85  # two pieces, the words of both
    finally:
        worker.cancel()
        await asyncio.gather(worker, return_exceptions=True)
