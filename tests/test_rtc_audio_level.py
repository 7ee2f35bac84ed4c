"""The vectorised RTP audio level equals aiortc's own on every kind of frame, and the swap is
what aiortc's sender calls."""

from __future__ import annotations

import aiortc.rtp
import av
import numpy as np
import pytest

from duplex.edge.webrtc.rtc_options import audio_level_dbov, stock_audio_level_dbov, use_vectorised_audio_level


def _frame(samples: np.ndarray, layout: str) -> av.AudioFrame:
    frame = av.AudioFrame.from_ndarray(samples.reshape(1, -1), format="s16", layout=layout)
    frame.sample_rate = 48000
    return frame


@pytest.mark.parametrize("layout, channels", [("mono", 1), ("stereo", 2)])
def test_the_level_equals_aiortcs_from_silence_to_full_scale(layout, channels):
    rng = np.random.default_rng(7)
    for amplitude in (0, 1, 3, 30, 300, 3000, 12000, 32767):
        for _ in range(5):
            pcm = np.clip(rng.normal(0, amplitude, 960 * channels), -32768, 32767).astype(np.int16)
            frame = _frame(pcm, layout)
            assert audio_level_dbov(frame) == stock_audio_level_dbov(frame), amplitude
    tone = (12000 * np.sin(np.arange(960 * channels) / 7)).astype(np.int16)
    assert audio_level_dbov(_frame(tone, layout)) == stock_audio_level_dbov(_frame(tone, layout))


def test_the_swap_replaces_what_the_sender_calls():
    use_vectorised_audio_level()
    assert aiortc.rtp.compute_audio_level_dbov is audio_level_dbov
    assert stock_audio_level_dbov is not audio_level_dbov
