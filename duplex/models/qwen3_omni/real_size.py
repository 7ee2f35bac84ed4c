"""Qwen3-Omni at its real shapes with random weights, built in-process on the stage's device.

No real checkpoint can be fetched, but a real model's compute can be reproduced: the parts are
built from ``transformers``' config classes with the shapes of Qwen/Qwen3-Omni-30B-A3B-Instruct
(thinker: MoE, 48 layers, hidden 2048, 128 experts top-8; talker: MoE, 20 layers, hidden 1024,
128 experts top-6; code predictor: 5 layers; code2wav: 8 layers + the 1920x ConvNet; audio
tower: 32 layers, d_model 1280), directly on the device (a ``torch.device`` context), in the
stage's dtype. Nothing real-size touches the disk. The weights are noise, so replies are noise;
timings are those of the real architecture.

``shrink`` takes dotted overrides of the config (``thinker_config.text_config.num_hidden_layers:
2``), which is how CPU tests exercise this path at a size a CPU can hold.
"""

from __future__ import annotations

import copy
import time
from typing import TYPE_CHECKING, Any, cast

import torch

if TYPE_CHECKING:
    from transformers import PreTrainedConfig

SHAPES = ("qwen3-omni-30b-a3b",)

# Special ids of the real tokenizer (Qwen3-Omni-30B-A3B-Instruct's config.json).
_TOKENS = {"im_start_token_id": 151644, "im_end_token_id": 151645, "tts_pad_token_id": 151671,
           "tts_bos_token_id": 151672, "tts_eos_token_id": 151673, "system_token_id": 8948,
           "user_token_id": 872, "assistant_token_id": 77091}
_MM = {"audio_token_id": 151675, "audio_start_token_id": 151669, "image_token_id": 151655,
       "video_token_id": 151656, "vision_start_token_id": 151652}
_MROPE = {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [24, 20, 20], "interleaved": True}


def _thinker() -> dict:
    text = {"hidden_size": 2048, "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4,
            "head_dim": 128, "intermediate_size": 768, "moe_intermediate_size": 768, "num_experts": 128,
            "num_experts_per_tok": 8, "norm_topk_prob": True, "vocab_size": 152064, "rms_norm_eps": 1e-6,
            "max_position_embeddings": 65536, "rope_parameters": dict(_MROPE), "shared_expert_intermediate_size": 0}
    audio = {"num_mel_bins": 128, "encoder_layers": 32, "encoder_attention_heads": 20, "encoder_ffn_dim": 5120,
             "d_model": 1280, "output_dim": 2048, "downsample_hidden_size": 480, "n_window": 50,
             "n_window_infer": 800, "max_source_positions": 1500, "conv_chunksize": 500}
    # The vision tower is never built by a stage; a small one keeps the config cheap to make.
    vision = {"depth": 1, "hidden_size": 64, "intermediate_size": 128, "num_heads": 2, "out_hidden_size": 2048}
    return {"audio_config": audio, "text_config": text, "vision_config": vision, "user_token_id": 872,
            **{k: v for k, v in _MM.items() if k != "vision_start_token_id"}}


def _talker() -> dict:
    text = {"hidden_size": 1024, "num_hidden_layers": 20, "num_attention_heads": 16, "num_key_value_heads": 2,
            "head_dim": 128, "intermediate_size": 2048, "moe_intermediate_size": 384, "num_experts": 128,
            "num_experts_per_tok": 6, "norm_topk_prob": True, "vocab_size": 3072, "rms_norm_eps": 1e-6,
            "max_position_embeddings": 65536, "rope_parameters": dict(_MROPE),
            "shared_expert_intermediate_size": 768}
    predictor = {"hidden_size": 1024, "num_hidden_layers": 5, "num_attention_heads": 16, "num_key_value_heads": 8,
                 "head_dim": 128, "intermediate_size": 3072, "vocab_size": 2048, "num_code_groups": 16,
                 "rms_norm_eps": 1e-6, "max_position_embeddings": 32768,
                 "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}}
    return {"text_config": text, "code_predictor_config": predictor, "num_code_groups": 16,
            "thinker_hidden_size": 2048, "accept_hidden_layer": 24, "spatial_merge_size": 2,
            "speaker_id": {"chelsie": 2301, "ethan": 2302, "aiden": 2303},
            "codec_bos_id": 2149, "codec_eos_token_id": 2150, "codec_pad_id": 2148, "codec_nothink_id": 2155,
            "codec_think_bos_id": 2156, "codec_think_eos_id": 2157, **_MM}


def _code2wav() -> dict:
    return {"codebook_size": 2048, "hidden_size": 1024, "num_attention_heads": 16, "num_key_value_heads": 16,
            "intermediate_size": 3072, "num_hidden_layers": 8, "num_quantizers": 16, "sliding_window": 72,
            "upsample_rates": [8, 5, 4, 3], "upsampling_ratios": [2, 2], "decoder_dim": 1536,
            "max_position_embeddings": 8000, "rms_norm_eps": 1e-5, "layer_scale_initial_scale": 0.01}


def _set_dotted(tree: dict, dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    for key in keys[:-1]:
        tree = tree.setdefault(key, {})
    tree[keys[-1]] = value


def real_config(shapes: str = "qwen3-omni-30b-a3b", shrink: dict[str, Any] | None = None):
    """The full ``Qwen3OmniMoeConfig`` of ``shapes``, with the fields the modelling code reads but
    the config classes do not declare (see FIELD_NOTES), and ``shrink``'s dotted overrides."""
    from transformers import Qwen3OmniMoeConfig

    if shapes not in SHAPES:
        raise ValueError(f"unknown shapes {shapes!r}: one of {', '.join(SHAPES)}")
    raw = {"thinker_config": _thinker(), "talker_config": _talker(), "code2wav_config": _code2wav()}
    for dotted, value in (shrink or {}).items():
        _set_dotted(raw, dotted, copy.deepcopy(value))
    kwargs: dict[str, Any] = {**raw, **_TOKENS}
    config = Qwen3OmniMoeConfig(**kwargs, enable_audio_output=True)
    # Typed as the dicts they may be given as; the config's __post_init__ has made them configs.
    thinker_config = cast("PreTrainedConfig", config.thinker_config)
    talker_config = cast("PreTrainedConfig", config.talker_config)
    thinker_config.vision_start_token_id = _MM["vision_start_token_id"]
    talker = raw["talker_config"]
    talker_config.text_config.shared_expert_intermediate_size = talker["text_config"][
        "shared_expert_intermediate_size"]
    talker_config.spatial_merge_size = 2
    config.duplex_tokens = {"audio_end_token_id": 151670, "newline_token_id": 198}
    return config


@torch.no_grad()
def fill_random(module: torch.nn.Module, seed: int, std: float = 0.02) -> None:
    """One normal_ per matrix, on the device. transformers' own init leaves some expert tensors
    as torch.empty (garbage, at times ~1e25); norms and biases keep the constructors' values."""
    generator = torch.Generator(device=next(module.parameters()).device).manual_seed(seed)
    for _, param in sorted(module.named_parameters()):
        if param.ndim >= 2:
            param.normal_(0.0, std, generator=generator)


def build_part(kind: str, config, device: str, dtype: torch.dtype, seed: int = 0):
    """One stage's module (``encoder``, ``thinker``, ``talker``, ``code2wav``), built on ``device``
    in ``dtype`` with random weights; returns (module, seconds it took)."""
    from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe as m

    from duplex.models.qwen3_omni.loading import ThinkerLM

    start = time.perf_counter()
    # transformers picks grouped_mm for the experts where it can (one kernel per projection, no
    # host sync, so a CUDA graph can capture the talker's MoE); eager elsewhere.
    kwargs = {"dtype": dtype}
    with torch.device(device):
        if kind == "encoder":
            module = m.Qwen3OmniMoeAudioEncoder._from_config(config.thinker_config.audio_config, dtype=dtype)
        elif kind == "thinker":
            module = ThinkerLM(config.thinker_config.text_config, **kwargs)
        elif kind == "talker":
            module = m.Qwen3OmniMoeTalkerForConditionalGeneration._from_config(config.talker_config, **kwargs)
        elif kind == "code2wav":
            module = m.Qwen3OmniMoeCode2Wav._from_config(config.code2wav_config, dtype=dtype)
        else:
            raise ValueError(f"unknown part {kind!r}")
    with torch.no_grad():  # the thinker's output layer is made outside _from_config's dtype; buffers stay
        for param in module.parameters():
            if param.dtype != dtype:
                param.data = param.data.to(dtype)
    fill_random(module, seed)
    module.requires_grad_(False)  # inference only: no op may record an autograd graph
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)
    return module.eval(), time.perf_counter() - start

