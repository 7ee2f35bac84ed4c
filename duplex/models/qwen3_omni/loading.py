"""Load one part of a Qwen3-Omni checkpoint directory (tiny or real), offline.

Each stage process needs one part only (audio encoder, thinker LLM, talker, code2wav), so the
part is built from its own config and only the tensors under its prefix are read from the
safetensors files (single file or sharded with an index).
"""

from __future__ import annotations

import functools
import inspect
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch import nn


@dataclass(frozen=True)
class SpecialTokens:
    """The text-side ids the pipeline needs, read from the checkpoint's config."""

    im_start: int
    im_end: int
    system: int
    user: int
    assistant: int
    audio: int
    audio_start: int
    audio_end: int
    newline: int
    tts_bos: int
    tts_eos: int
    tts_pad: int


def load_config(model_dir: str | Path):
    from transformers import Qwen3OmniMoeConfig

    return Qwen3OmniMoeConfig.from_pretrained(str(model_dir), local_files_only=True)


def special_tokens(config) -> SpecialTokens:
    thinker = config.thinker_config
    # The real checkpoint's tokenizer puts audio_end right after audio_start's pair and "\n" at 198.
    extra = getattr(config, "duplex_tokens", None) or {}
    return SpecialTokens(
        im_start=config.im_start_token_id,
        im_end=config.im_end_token_id,
        system=config.system_token_id,
        user=config.user_token_id,
        assistant=config.assistant_token_id,
        audio=thinker.audio_token_id,
        audio_start=thinker.audio_start_token_id,
        audio_end=extra.get("audio_end_token_id", thinker.audio_start_token_id + 1),
        newline=extra.get("newline_token_id", 198),
        tts_bos=config.tts_bos_token_id,
        tts_eos=config.tts_eos_token_id,
        tts_pad=config.tts_pad_token_id,
    )


def _weight_files(model_dir: Path) -> list[Path]:
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [model_dir / shard for shard in shards]
    single = model_dir / "model.safetensors"
    if not single.exists():
        raise FileNotFoundError(f"{model_dir}: no model.safetensors or model.safetensors.index.json")
    return [single]


def read_tensors(model_dir: str | Path, prefix: str) -> dict[str, torch.Tensor]:
    """Every tensor whose name starts with ``prefix``, keyed by the rest of its name."""
    tensors: dict[str, torch.Tensor] = {}
    for path in _weight_files(Path(model_dir)):
        with safe_open(str(path), framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118  # a safetensors handle has keys() but no __iter__
                if name.startswith(prefix):
                    tensors[name[len(prefix):]] = handle.get_tensor(name)
    if not tensors:
        raise KeyError(f"{model_dir}: no tensors under {prefix!r}")
    return tensors


_EXPERT = re.compile(r"^(.*\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")


def merge_experts(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Checkpoints store one tensor per expert; the modules hold all experts in two 3-D tensors
    (``gate_up_proj`` = gate and up stacked per expert, ``down_proj``)."""
    merged: dict[str, torch.Tensor] = {}
    experts: dict[str, dict[int, dict[str, torch.Tensor]]] = {}
    for name, tensor in state.items():
        match = _EXPERT.match(name)
        if match is None:
            merged[name] = tensor
            continue
        base, index, kind = match.group(1), int(match.group(2)), match.group(3)
        experts.setdefault(base, {}).setdefault(index, {})[kind] = tensor
    for base, by_index in experts.items():
        order = [by_index[i] for i in sorted(by_index)]
        merged[f"{base}.gate_up_proj"] = torch.stack([torch.cat([e["gate_proj"], e["up_proj"]]) for e in order])
        merged[f"{base}.down_proj"] = torch.stack([e["down_proj"] for e in order])
    return merged


def load_part(module: nn.Module, model_dir: str | Path, prefix: str, device: str = "cpu") -> nn.Module:
    """Fill ``module`` from the checkpoint tensors under ``prefix``; every weight must be present."""
    state = merge_experts(read_tensors(model_dir, prefix))
    missing, unexpected = module.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(f"{model_dir} [{prefix}]: missing {missing[:5]}, unexpected {unexpected[:5]}")
    return module.to(device).eval()


def load_audio_encoder(model_dir, device: str = "cpu"):
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeAudioEncoder

    config = load_config(model_dir)
    module = Qwen3OmniMoeAudioEncoder._from_config(config.thinker_config.audio_config)
    return load_part(module, model_dir, "thinker.audio_tower.", device), config


class ThinkerLM(nn.Module):
    """The thinker's text decoder and output layer (no audio or vision towers)."""

    def __init__(self, text_config, **from_config) -> None:
        super().__init__()
        from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeThinkerTextModel

        self.model = Qwen3OmniMoeThinkerTextModel._from_config(text_config, **from_config)
        self.lm_head = nn.Linear(text_config.hidden_size, text_config.vocab_size, bias=False)


def load_thinker(model_dir, device: str = "cpu"):
    config = load_config(model_dir)
    module = ThinkerLM(config.thinker_config.text_config)
    return _load_thinker(module, model_dir, device), config


def _load_thinker(module: ThinkerLM, model_dir, device: str) -> ThinkerLM:
    state = {f"model.{k}": v for k, v in merge_experts(read_tensors(model_dir, "thinker.model.")).items()}
    state["lm_head.weight"] = read_tensors(model_dir, "thinker.lm_head.")["weight"]
    missing, unexpected = module.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(f"{model_dir} [thinker]: missing {missing[:5]}, unexpected {unexpected[:5]}")
    return module.to(device).eval()


def load_talker(model_dir, device: str = "cpu"):
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
        Qwen3OmniMoeTalkerForConditionalGeneration,
    )

    config = load_config(model_dir)
    module = Qwen3OmniMoeTalkerForConditionalGeneration._from_config(config.talker_config)
    return load_part(module, model_dir, "talker.", device), config


def load_code2wav(model_dir, device: str = "cpu"):
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeCode2Wav

    config = load_config(model_dir)
    module = Qwen3OmniMoeCode2Wav._from_config(config.code2wav_config)
    return load_part(module, model_dir, "code2wav.", device), config


def cache_kwargs(model: nn.Module, cache) -> dict:
    """The KV argument under its name in the installed transformers: ``cache`` (5.2x) or
    ``past_key_values`` (5.17, the GPU machine's; 5.2x still accepts it, deprecated)."""
    return {_cache_name(type(model).forward): cache}


@functools.cache  # per class's forward: looked up in every step
def _cache_name(forward: Callable[..., Any]) -> str:
    return "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"
