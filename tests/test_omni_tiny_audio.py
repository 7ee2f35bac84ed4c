"""The tiny Qwen3-Omni checkpoint speaks: its code2wav turns codes into an audible speech-band
tone whose level follows the codes, every weight follows from the seed, and a checkpoint cached by
an older version is rewritten once, even when stage processes start together."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from duplex.models.qwen3_omni import parts
from duplex.models.qwen3_omni.loading import load_code2wav, read_tensors
from duplex.models.qwen3_omni.tiny import TINY_VERSION, checkpoint_version, init_tiny, refresh_if_stale

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[1]
SAMPLE_RATE = 24000


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.getbasetemp() / "omni-tiny"  # the checkpoint the other omni tests share
    if not (path / "model.safetensors").exists():
        init_tiny(path)
    return path


def dbfs(wav: np.ndarray) -> float:
    return float(20 * np.log10(np.sqrt(np.mean(wav.astype(np.float64) ** 2)) + 1e-12))


def band_share(wav: np.ndarray, low: float = 100.0, high: float = 4000.0) -> float:
    power = np.abs(np.fft.rfft(wav.astype(np.float64))) ** 2
    freqs = np.fft.rfftfreq(len(wav), 1 / SAMPLE_RATE)
    return float(power[(freqs >= low) & (freqs <= high)].sum() / power.sum())


def test_code2wav_speaks_a_speech_band_tone_that_differs_with_the_codes(model_dir):
    code2wav, _ = load_code2wav(model_dir)
    rng = np.random.default_rng(7)
    codes = [rng.integers(0, 256, (16, 50)) for _ in range(3)] + [np.zeros((16, 50), dtype=np.int64)]
    with torch.no_grad():
        wavs = [code2wav(torch.as_tensor(c)[None])[0, 0].numpy() for c in codes]
    for wav in wavs:
        assert wav.shape == (50 * 1920 - 555,)
        assert dbfs(wav) > -30.0, dbfs(wav)
        assert band_share(wav) > 0.99, band_share(wav)
        assert np.abs(wav).max() < 1.0  # under code2wav's clamp: the tone is not clipped
    for i in range(len(wavs)):
        for j in range(i + 1, len(wavs)):
            assert np.linalg.norm(wavs[i] - wavs[j]) / np.linalg.norm(wavs[i]) > 0.02, (i, j)
    # The level follows the codes frame by frame, not only per utterance.
    frame_rms = np.sqrt(np.mean(wavs[0][: 49 * 1920].reshape(49, 1920) ** 2, axis=1))
    assert frame_rms.max() / frame_rms.min() > 1.05


def test_the_same_seed_writes_the_same_bytes_and_the_talker_experts_are_drawn(tmp_path):
    first, again, other = (init_tiny(tmp_path / name, seed=seed) for name, seed in
                           (("a", 0), ("b", 0), ("c", 1)))
    assert (first / "model.safetensors").read_bytes() == (again / "model.safetensors").read_bytes()
    assert (first / "config.json").read_text() == (again / "config.json").read_text()
    assert (first / "model.safetensors").read_bytes() != (other / "model.safetensors").read_bytes()
    experts = {k: v for k, v in read_tensors(first, "talker.").items() if ".experts." in k}
    assert len(experts) == 2 * 4 * 3  # 2 layers x 4 experts x gate/up/down
    spread = torch.cat([v.flatten() for v in experts.values()])
    assert 0.01 < float(spread.std()) < 0.03  # initializer_range 0.02, not whatever torch.empty held
    assert checkpoint_version(first) == TINY_VERSION
    assert not list(tmp_path.glob(".*"))  # the staging folders are gone


def _make_stale(directory: Path) -> None:
    """What version 1 left in the cache: no marker, and code2wav's inaudible random output layer."""
    config = json.loads((directory / "config.json").read_text())
    config.pop("duplex_tiny_version")
    config.pop("duplex_tiny_seed")
    (directory / "config.json").write_text(json.dumps(config))
    from safetensors.torch import load_file, save_file

    tensors = load_file(directory / "model.safetensors")
    tensors["code2wav.decoder.6.conv.weight"] = torch.full_like(tensors["code2wav.decoder.6.conv.weight"], 1e-6)
    save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})


def test_a_stale_checkpoint_is_rewritten_once_by_parallel_stage_processes(model_dir, tmp_path):
    cached = init_tiny(tmp_path / "cached", seed=0)
    _make_stale(cached)
    assert checkpoint_version(cached) == 1
    script = ("import sys; from duplex.models.qwen3_omni.tiny import refresh_if_stale; "
              "print('wrote' if refresh_if_stale(sys.argv[1]) else 'current')")
    procs = [subprocess.Popen([sys.executable, "-c", script, str(cached)], cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [p.communicate(timeout=180) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in results]
    assert sorted(out.strip() for out, _ in results) == ["current", "wrote"]
    assert checkpoint_version(cached) == TINY_VERSION
    # Version 1 recorded no seed; the cache was written with the default one (0), as model_dir was.
    assert (cached / "model.safetensors").read_bytes() == (model_dir / "model.safetensors").read_bytes()
    assert refresh_if_stale(cached) is False


def test_the_stages_refresh_only_the_default_cache_and_never_a_real_checkpoint(tmp_path, monkeypatch):
    default, own = init_tiny(tmp_path / "default"), init_tiny(tmp_path / "own")
    for path in (default, own):
        _make_stale(path)
    monkeypatch.setattr(parts, "DEFAULT_MODEL_DIR", str(default))
    assert parts.model_dir({"model_dir": str(own)}, "code2wav") == str(own)
    assert checkpoint_version(own) == 1  # a directory the config names is the user's: left as it is
    assert parts.model_dir({}, "code2wav") == str(default)
    assert checkpoint_version(default) == TINY_VERSION
    # A real checkpoint's config has no tiny token map: never rewritten.
    real = tmp_path / "real"
    real.mkdir()
    (real / "config.json").write_text(json.dumps({"model_type": "qwen3_omni_moe"}))
    assert checkpoint_version(real) is None and refresh_if_stale(real) is False
    assert json.loads((real / "config.json").read_text()) == {"model_type": "qwen3_omni_moe"}
