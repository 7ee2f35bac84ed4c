"""A tiny random-init Qwen3-Omni checkpoint, written locally for tests and CPU benchmarks.

Same architecture and code paths as the real checkpoint (MoE thinker and talker, 16-codebook code
predictor, code2wav with the real 1920x upsampling), with small widths and a 512-word vocabulary.
The special token ids are remapped into that vocabulary. code2wav's output layers are set by hand
(tiny_voice) so that the tiny model's speech is an audible tone, and every weight is a function
of the seed (transformers leaves the talker's MoE experts as torch.empty).

config.json carries ``duplex_tiny_version``: a checkpoint cached by an older version is rewritten
by ``refresh_if_stale`` (the stages call it for the default cached directory).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

if TYPE_CHECKING:
    from transformers import PreTrainedConfig

# 1: unmarked (inaudible code2wav, talker experts left uninitialised); 2: tiny_voice + seeded experts.
TINY_VERSION = 2

TINY_VOCAB = 512
CODEBOOK = 256
NUM_CODE_GROUPS = 16
HIDDEN = 64

# Special text tokens, remapped into the tiny vocabulary (the real ones live above 151k).
TOKENS = {
    "im_start_token_id": 500,
    "im_end_token_id": 501,
    "tts_pad_token_id": 502,
    "tts_bos_token_id": 503,
    "tts_eos_token_id": 504,
    "system_token_id": 505,
    "user_token_id": 506,
    "assistant_token_id": 507,
    "audio_token_id": 508,
    "audio_start_token_id": 509,
    "audio_end_token_id": 510,
    "newline_token_id": 511,
    "image_token_id": 496,
    "video_token_id": 497,
    "vision_start_token_id": 498,
}

# Codec control ids sit in the top 1024 ids of the talker vocabulary (codebook + 1024 words).
CODEC = {
    "codec_pad_id": CODEBOOK + 0,
    "codec_bos_id": CODEBOOK + 1,
    "codec_eos_token_id": CODEBOOK + 2,
    "codec_nothink_id": CODEBOOK + 3,
    "codec_think_bos_id": CODEBOOK + 4,
    "codec_think_eos_id": CODEBOOK + 5,
}
SPEAKERS = {"ethan": CODEBOOK + 10, "chelsie": CODEBOOK + 11}


def _attention(layers: int, heads: int = 4, kv_heads: int = 2, head_dim: int = 16) -> dict:
    return {
        "hidden_size": HIDDEN,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
    }


def _moe() -> dict:
    return {
        "intermediate_size": 128,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 64,
        "num_experts": 4,
        "num_experts_per_tok": 2,
    }


def tiny_config():
    """The full Qwen3OmniMoeConfig of the tiny model, with every field the modelling code reads."""
    from transformers import Qwen3OmniMoeConfig

    mrope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [4, 2, 2], "interleaved": True}
    text = {**_attention(2), **_moe(), "vocab_size": TINY_VOCAB, "rope_parameters": mrope,
            "max_position_embeddings": 4096}
    audio = {
        "num_mel_bins": 128,
        "encoder_layers": 2,
        "encoder_attention_heads": 4,
        "encoder_ffn_dim": 128,
        "d_model": HIDDEN,
        "output_dim": HIDDEN,
        "downsample_hidden_size": 16,
        "n_window": 50,
        # Attention windows of 2 s (800 = 8 s in the real model): small, so tests cross a window edge.
        "n_window_infer": 200,
        "max_source_positions": 1500,
    }
    thinker = {
        "audio_config": audio,
        "text_config": text,
        "vision_config": {"depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
                          "out_hidden_size": HIDDEN},
        "audio_token_id": TOKENS["audio_token_id"],
        "audio_start_token_id": TOKENS["audio_start_token_id"],
        "image_token_id": TOKENS["image_token_id"],
        "video_token_id": TOKENS["video_token_id"],
        "user_token_id": TOKENS["user_token_id"],
    }
    talker_text = {
        **_attention(2),
        **_moe(),
        "vocab_size": CODEBOOK + 1024,
        "rope_parameters": mrope,
        "max_position_embeddings": 8192,
    }
    code_predictor = {
        **_attention(2),
        "intermediate_size": 128,
        "vocab_size": CODEBOOK,
        "num_code_groups": NUM_CODE_GROUPS,
    }
    talker = {
        "text_config": talker_text,
        "code_predictor_config": code_predictor,
        "num_code_groups": NUM_CODE_GROUPS,
        "thinker_hidden_size": HIDDEN,
        "accept_hidden_layer": 1,
        "speaker_id": SPEAKERS,
        "spatial_merge_size": 2,
        "audio_token_id": TOKENS["audio_token_id"],
        "audio_start_token_id": TOKENS["audio_start_token_id"],
        "image_token_id": TOKENS["image_token_id"],
        "video_token_id": TOKENS["video_token_id"],
        "vision_start_token_id": TOKENS["vision_start_token_id"],
        **CODEC,
    }
    code2wav = {
        "codebook_size": CODEBOOK,
        "hidden_size": HIDDEN,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_quantizers": NUM_CODE_GROUPS,
        # The real window is 72 frames; 8 keeps exact streaming's left context short on a CPU.
        "sliding_window": 8,
        "upsample_rates": [8, 5, 4, 3],
        "upsampling_ratios": [2, 2],
        "decoder_dim": 64,
    }
    special: dict[str, Any] = {k: v for k, v in TOKENS.items() if k in _TOP_LEVEL_TOKENS}
    config = Qwen3OmniMoeConfig(
        thinker_config=thinker, talker_config=talker, code2wav_config=code2wav, enable_audio_output=True, **special
    )
    # Typed as the dicts they may be given as; the config's __post_init__ has made them configs.
    thinker_config = cast("PreTrainedConfig", config.thinker_config)
    talker_config = cast("PreTrainedConfig", config.talker_config)
    # Read by the modelling code but not declared by the config classes.
    thinker_config.vision_start_token_id = TOKENS["vision_start_token_id"]
    talker_config.text_config.shared_expert_intermediate_size = 64
    talker_config.spatial_merge_size = 2
    # Ids the tiny vocabulary needs that the config has no field for (see loading.special_tokens).
    config.duplex_tokens = {"audio_end_token_id": TOKENS["audio_end_token_id"],
                            "newline_token_id": TOKENS["newline_token_id"]}
    return config


_TOP_LEVEL_TOKENS = {
    "im_start_token_id",
    "im_end_token_id",
    "tts_pad_token_id",
    "tts_bos_token_id",
    "tts_eos_token_id",
    "system_token_id",
    "user_token_id",
    "assistant_token_id",
}


def init_tiny(directory: str | Path, seed: int = 0) -> Path:
    """Write a random-init tiny checkpoint (config.json + model.safetensors) into ``directory``.

    The same seed gives the same weights. Files are written beside and moved in, config.json
    (with the version marker) last, so a reader never sees a new marker over old weights.
    """
    from transformers import Qwen3OmniMoeForConditionalGeneration

    from duplex.models.qwen3_omni.tiny_voice import set_voice

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    config = tiny_config()
    config.duplex_tiny_version = TINY_VERSION
    config.duplex_tiny_seed = seed
    model = Qwen3OmniMoeForConditionalGeneration(config)
    _seed_experts(model, seed)
    _spread_codec_logits(model)
    set_voice(model.code2wav)
    staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}-", dir=directory.parent))
    try:
        model.save_pretrained(staging, safe_serialization=True)
        names = sorted(p.name for p in staging.iterdir())
        for name in [n for n in names if n != "config.json"] + ["config.json"]:
            os.replace(staging / name, directory / name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return directory


def checkpoint_version(directory: str | Path) -> int | None:
    """The tiny version that wrote ``directory``; None for a checkpoint that is not a tiny one."""
    raw = json.loads((Path(directory) / "config.json").read_text())
    if "duplex_tokens" not in raw:  # only the tiny config carries it: a real checkpoint
        return None
    return int(raw.get("duplex_tiny_version", 1))


def refresh_if_stale(directory: str | Path) -> bool:
    """Rewrite a tiny checkpoint that an older version wrote (same seed); True if it did.

    Stage processes start in parallel and each calls this: the file lock makes one of them
    write while the others wait, and they then find the checkpoint current.
    """
    directory = Path(directory)
    with _locked(directory / ".duplex-tiny.lock"):
        version = checkpoint_version(directory)
        if version is None or version >= TINY_VERSION:
            return False
        seed = int(json.loads((directory / "config.json").read_text()).get("duplex_tiny_seed", 0))
        init_tiny(directory, seed=seed)
        return True


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _seed_experts(model, seed: int) -> None:
    """transformers 5.24 allocates the talker's expert tensors with torch.empty and never fills
    them (different every run, at times ~1e25): draw every expert tensor from the seed."""
    generator = torch.Generator().manual_seed(seed)
    std = model.config.talker_config.text_config.initializer_range
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            if ".experts." in name and param.ndim == 3:
                param.copy_(torch.randn(param.shape, generator=generator) * std)


def _spread_codec_logits(model) -> None:
    """Random init gives near-flat logits; widen the heads so greedy picks are far from ties.

    Ties would make exact-equality tests depend on float summation order, which batching changes.
    """
    with torch.no_grad():
        model.thinker.lm_head.weight.mul_(20.0)
        model.talker.codec_head.weight.mul_(20.0)
        # A random talker often picks end-of-speech at once; silence it so turns end by length.
        model.talker.codec_head.weight[CODEC["codec_eos_token_id"]].zero_()
        for head in model.talker.code_predictor.lm_head:
            head.weight.mul_(20.0)
