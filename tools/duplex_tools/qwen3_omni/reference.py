"""The same turn run through transformers' own ``generate()``: the ground truth for equivalence.

Greedy on both thinker and talker (the talker keeps generate's repetition penalty and its
suppressed control ids, which the step runner applies too).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from duplex.models.qwen3_omni.loading import SpecialTokens, load_config, special_tokens
from duplex.runtime.contract import SESSION_RATE


@dataclass
class ReferenceTurn:
    text_tokens: list[int]
    codes: torch.Tensor  # (16, frames)
    waveform: np.ndarray  # float32, 24 kHz


def prompt_ids(tokens: SpecialTokens, num_audio_tokens: int, system_ids: list[int]) -> list[int]:
    t = tokens
    return [t.im_start, t.system, t.newline, *system_ids, t.im_end, t.newline,
            t.im_start, t.user, t.newline, t.audio_start, *([t.audio] * num_audio_tokens),
            t.audio_end, t.im_end, t.newline, t.im_start, t.assistant, t.newline]


class Reference:
    def __init__(self, model_dir: str) -> None:
        from transformers import (
            Qwen3OmniMoeForConditionalGeneration,
            WhisperFeatureExtractor,
        )

        self.model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(model_dir, local_files_only=True).eval()
        self.config = load_config(model_dir)
        self.tokens = special_tokens(self.config)
        self.features = WhisperFeatureExtractor(feature_size=self.config.thinker_config.audio_config.num_mel_bins)

    @torch.no_grad()
    def run(self, audio: np.ndarray, *, system_ids: list[int], thinker_max_new_tokens: int,
            talker_max_new_tokens: int, speaker: str = "ethan") -> ReferenceTurn:
        from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
            _get_feat_extract_output_lengths,
        )

        feats = self.features(audio, sampling_rate=SESSION_RATE, return_attention_mask=True, return_tensors="pt",
                              padding="longest")
        num_audio = int(_get_feat_extract_output_lengths(feats["attention_mask"].sum(-1)).item())
        ids = torch.tensor([prompt_ids(self.tokens, num_audio, system_ids)])
        captured: list[torch.Tensor] = []
        decode = self.model.code2wav.chunked_decode

        def tap(codes, **kwargs):  # generate() does not return the codes; record them on the way
            captured.append(codes.clone())
            return decode(codes, **kwargs)

        self.model.code2wav.chunked_decode = tap
        try:
            sequences, wav = self.model.generate(
                input_ids=ids, input_features=feats["input_features"], feature_attention_mask=feats["attention_mask"],
                thinker_max_new_tokens=thinker_max_new_tokens, thinker_eos_token_id=self.tokens.im_end,
                thinker_do_sample=False, talker_do_sample=False, talker_max_new_tokens=talker_max_new_tokens,
                speaker=speaker)
        finally:
            del self.model.code2wav.chunked_decode
        return ReferenceTurn(sequences[0, ids.shape[1]:].tolist(), captured[0][0], wav.reshape(-1).float().numpy())
