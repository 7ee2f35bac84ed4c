"""The demo page in a real headless Chromium with a fake microphone playing a speech WAV.

Set DUPLEX_SCREENSHOT=path.png to keep a screenshot of the page mid-conversation (the README's
docs/assets/demo.png is made this way).
"""

from __future__ import annotations

import os
import shutil
import time

import numpy as np
import pytest

from duplex_tools.harness import ServerProcess, espeak, write_wav

pytestmark = pytest.mark.slow
CHROMIUM = "/usr/bin/chromium"
playwright_api = pytest.importorskip("playwright.sync_api")


@pytest.fixture(scope="module", params=[0, 1], ids=["media-in-server", "media-worker"])
def server(request):
    """The page talks to the server's own event loop, then to a media worker process."""
    with ServerProcess(["--config", "toy-voice", "--port", "0", "--ice-loopback",
                        "--media-workers", str(request.param)]) as proc:
        proc.media_workers = request.param
        yield proc
    assert proc.stop() == 0


@pytest.fixture(scope="module")
def fake_mic(tmp_path_factory) -> str:
    """A question, then a pause: the turn ends, the reply starts, and the looping file asks
    again while the agent is still talking (a barge-in)."""
    speech = espeak("Hello, what can you tell me about the weather today", rate=48000)
    silence = np.zeros(48000 * 3, np.float32)
    path = tmp_path_factory.mktemp("mic") / "question.wav"
    write_wav(path, np.concatenate([np.zeros(24000, np.float32), speech, silence]), 48000)
    return str(path)


def chromium_args(wav: str) -> list[str]:
    return ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--use-fake-ui-for-media-stream",
            "--use-fake-device-for-media-stream", f"--use-file-for-fake-audio-capture={wav}",
            "--autoplay-policy=no-user-gesture-required", "--allow-loopback-in-peer-connection",
            "--disable-features=WebRtcHideLocalIpsWithMdns"]


@pytest.mark.skipif(shutil.which(CHROMIUM) is None, reason="Debian chromium is not installed")
def test_demo_page_talks_with_the_agent(server, fake_mic, tmp_path):
    import httpx

    with playwright_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=chromium_args(fake_mic))
        try:
            page = browser.new_page(viewport={"width": 1180, "height": 760})
            console = []
            page.on("console", lambda msg: console.append(msg.text))
            page.goto(server.url + "/")
            assert page.title().startswith("duplex")
            page.click("#connect")
            page.wait_for_function("window.duplex.connected === true", timeout=20000)
            if server.media_workers:  # the page's call is carried by the worker
                assert httpx.get(server.url + "/duplex/stats").json()["edges"]["media"]["calls"] == [1]
            page.wait_for_function("document.querySelector('#model').textContent === 'toy-voice'", timeout=5000)
            user = page.wait_for_selector("#transcript li.user span:not(.who):text-matches('s of speech')",
                                          timeout=30000)
            assert "syllables" in user.text_content()
            page.wait_for_function("window.duplex.agentPeak > 0.02", timeout=20000)
            page.wait_for_selector("#transcript li.agent", timeout=5000)
            page.wait_for_function("document.querySelector('#metrics tbody td.num') && "
                                   "document.querySelector('#metrics tbody td.num').textContent.endsWith('ms')",
                                   timeout=10000)
            # The turn's waterfall: its parts, in order, adding up to the first-audio time beside it.
            page.wait_for_selector("#metrics tbody .waterfall .part.end_of_turn", timeout=10000)
            parts = page.evaluate("[...document.querySelector('#metrics tbody .waterfall').children]"
                                  ".map(p => [p.classList[1], parseFloat(p.dataset.ms)])")
            ttfa = page.evaluate("parseInt(document.querySelector('#metrics tbody .waterfall')"
                                 ".closest('tr').cells[1].textContent)")
            assert parts[0][0] == "end_of_turn", parts  # a part that took no time has no segment
            assert abs(sum(ms for _, ms in parts) - ttfa) <= 1 + 0.1 * len(parts), (parts, ttfa)
            events = page.evaluate("window.duplex.events.map(e => e.type)")
            for expected in ("session.created", "input_audio_buffer.speech_started",
                             "conversation.item.input_audio_transcription.completed", "output_audio_buffer.started"):
                assert expected in events, (expected, events)
            # The file loops: the question comes again while the agent talks, and interrupts it.
            page.wait_for_selector("#transcript li.agent.truncated", timeout=20000)
            page.wait_for_function("[...document.querySelectorAll('#metrics tbody td.num')]"
                                   ".some(td => td.cellIndex === 3 && td.textContent.endsWith('ms'))", timeout=10000)
            heard_stop = page.evaluate("[...document.querySelectorAll('#metrics tbody td.num')]"
                                       ".filter(td => td.cellIndex === 3 && td.textContent.endsWith('ms'))"
                                       ".map(td => parseInt(td.textContent))")
            print(f"\ndemo page: barge-in stop heard in the browser: {heard_stop} ms")
            _switch_turn_detection(page)
            page.screenshot(path=str(os.environ.get("DUPLEX_SCREENSHOT") or tmp_path / "demo.png"))
            page.click("#hangup")
            page.wait_for_function("document.querySelector('#state').dataset.state === 'disconnected'", timeout=10000)
        finally:
            browser.close()
    deadline = time.monotonic() + 5
    while httpx.get(server.url + "/duplex/stats").json()["sessions"]["live"] != 0:
        assert time.monotonic() < deadline, "the page's hang-up did not end the session"
        time.sleep(0.05)


def _switch_turn_detection(page) -> None:
    """The page shows the call's turn detection (toy-voice's sessions: silence) as the server
    described it, and its control asks for another with a session.update that the server confirms
    with session.updated; the page then shows what the server says, not what it asked."""
    mode = page.locator("#turn-mode")
    assert mode.get_attribute("data-mode") == "server_vad", mode.text_content()
    assert "500 ms of silence" in mode.text_content()
    assert page.locator("#turn-detection").input_value() == "server_vad"
    for wanted in ("semantic_vad", "server_vad", "semantic_vad"):  # the screenshot shows the last
        updates = page.evaluate("window.duplex.events.filter(e => e.type === 'session.updated').length")
        page.select_option("#turn-detection", wanted)
        page.wait_for_function(f"window.duplex.events.filter(e => e.type === 'session.updated').length > {updates}",
                               timeout=10000)
        sent = page.evaluate("window.duplex.sent.at(-1)")
        assert sent["type"] == "session.update"
        assert sent["session"]["audio"]["input"]["turn_detection"] == {"type": wanted}
        updated = page.evaluate("window.duplex.events.filter(e => e.type === 'session.updated').at(-1)")
        assert updated["session"]["audio"]["input"]["turn_detection"]["type"] == wanted, updated
        assert mode.get_attribute("data-mode") == wanted
        if wanted == "semantic_vad":  # this server has the end-of-turn audio model
            assert updated["session"]["duplex_turn_end"] == {"audio_model": True}
            assert mode.get_attribute("data-audio-model") == "true"
            assert "words and the voice" in mode.text_content()
