"""The one resampling helper (duplex.audio): rates, channels and sample formats convert, a stream
keeps its length across chunks, and an integer type it cannot scale is refused."""

import av
import numpy as np
import pytest

from duplex.audio import Resampler, resample


def tone(rate: int, seconds: float, hz: float = 440.0) -> np.ndarray:
    return (0.5 * np.sin(2 * np.pi * hz * np.arange(int(rate * seconds)) / rate)).astype(np.float32)


def dominant_hz(samples: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(samples.astype(np.float64)))
    return float(np.argmax(spectrum) * rate / len(samples))


def test_a_stream_of_frames_keeps_its_length_and_pitch():
    source = tone(24000, 1.0)
    resampler = Resampler(48000, out_channels=2)
    out = np.concatenate([*(resampler(source[i:i + 480], 24000) for i in range(0, len(source), 480)),
                          resampler.flush()])
    assert out.dtype == np.int16
    stereo = out.reshape(-1, 2)
    assert len(stereo) == 48000  # every input sample accounted for once the tail is flushed
    assert np.array_equal(stereo[:, 0], stereo[:, 1])
    assert abs(dominant_hz(stereo[2000:46000, 0], 48000) - 440) < 2


def test_stereo_int16_frames_downmix_to_the_session_rate():
    pcm = (tone(48000, 0.5, 1000) * 32767).astype(np.int16)
    frame = av.AudioFrame.from_ndarray(np.repeat(pcm, 2).reshape(1, -1), format="s16", layout="stereo")
    frame.sample_rate = 48000
    resampler = Resampler(16000)
    mono = np.concatenate([resampler.frame(frame), resampler.flush()])
    assert mono.dtype == np.int16 and len(mono) == 8000
    assert abs(dominant_hz(mono[500:7500], 16000) - 1000) < 3


def test_a_whole_clip_converts_with_its_tail():
    clip = resample(tone(22050, 1.0), 22050, 16000)
    assert clip.dtype == np.float32 and abs(len(clip) - 16000) <= 1
    assert resample(clip, 16000, 16000) is not clip  # same rate: a copy, never the caller's array


def test_an_integer_type_it_cannot_scale_is_refused():
    with pytest.raises(TypeError, match="int16 or float32"):
        Resampler(16000)(np.zeros(160, np.int32), 8000)
