"""The demo page against a server with an API key and ``--demo-open``, in a real headless
Chromium: the page holds no key, gets itself a client secret, calls with it and hangs up with it."""

from __future__ import annotations

import shutil
import time

import httpx
import numpy as np
import pytest

from duplex_tools.harness import ServerProcess, espeak, write_wav
from tests.test_browser_demo import CHROMIUM, chromium_args, playwright_api

pytestmark = [pytest.mark.slow, pytest.mark.skipif(shutil.which(CHROMIUM) is None,
                                                   reason="Debian chromium is not installed")]
KEY = "sk-test-demo-0123456789ab"


@pytest.fixture(scope="module")
def mic_wav(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("mic") / "order.wav"
    speech = espeak("One milk tea please", rate=48000)
    write_wav(path, np.concatenate([np.zeros(24000, np.float32), speech, np.zeros(48000 * 4, np.float32)]), 48000)
    return str(path)


def _stats(url: str) -> dict:
    return httpx.get(url + "/duplex/stats", headers={"Authorization": f"Bearer {KEY}"}).json()


def test_the_demo_page_calls_a_keyed_server_with_a_secret_of_its_own(mic_wav):
    with ServerProcess(["--config", "toy-voice", "--port", "0", "--ice-loopback", "--api-key", KEY,
                        "--demo-open"]) as server, playwright_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=chromium_args(mic_wav))
        try:
            page = browser.new_page()
            page.goto(server.url + "/")
            page.click("#connect")
            page.wait_for_function("window.duplex.connected === true", timeout=20000)
            page.wait_for_function("window.duplex.agentPeak > 0.02", timeout=30000)
            stats = _stats(server.url)
            assert stats["edges"]["access"]["minted"] == 1 and stats["edges"]["access"]["owned_calls"] == 1
            page.click("#hangup")
            page.wait_for_function("document.querySelector('#state').dataset.state === 'disconnected'",
                                   timeout=10000)
        finally:
            browser.close()
        deadline = time.monotonic() + 5
        while (stats := _stats(server.url))["sessions"]["live"] or stats["edges"]["access"]["owned_calls"]:
            assert time.monotonic() < deadline, f"the page's hang-up (with its secret) did not end the call: {stats}"
            time.sleep(0.05)
        assert stats["edges"]["webrtc"]["hung_up"] == 1
