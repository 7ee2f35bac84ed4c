"""The real-size omni path on the CPU: Qwen3-Omni-30B-A3B's shapes from transformers' config
classes, and the same code built small (``shrink``) with random weights in process, run through
the fused baseline for a turn of fixed length (end-of-sequence ignored)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from duplex.models.qwen3_omni.parts import load
from duplex.models.qwen3_omni.real_size import real_config
from duplex.runtime.contract import TurnRequest

torch.set_num_threads(1)

# Narrow widths and few layers/experts, the real vocabularies and special ids: the CPU holds it.
SHRINK = {
    "thinker_config.text_config.hidden_size": 64, "thinker_config.text_config.num_hidden_layers": 2,
    "thinker_config.text_config.num_attention_heads": 4, "thinker_config.text_config.num_key_value_heads": 2,
    "thinker_config.text_config.head_dim": 16, "thinker_config.text_config.moe_intermediate_size": 32,
    "thinker_config.text_config.num_experts": 8, "thinker_config.text_config.num_experts_per_tok": 2,
    "thinker_config.text_config.rope_parameters.mrope_section": [4, 2, 2],
    "thinker_config.audio_config.d_model": 64, "thinker_config.audio_config.encoder_layers": 2,
    "thinker_config.audio_config.encoder_attention_heads": 4, "thinker_config.audio_config.encoder_ffn_dim": 128,
    "thinker_config.audio_config.downsample_hidden_size": 16, "thinker_config.audio_config.output_dim": 64,
    "talker_config.thinker_hidden_size": 64, "talker_config.accept_hidden_layer": 1,
    "talker_config.text_config.hidden_size": 64, "talker_config.text_config.num_hidden_layers": 2,
    "talker_config.text_config.num_attention_heads": 4, "talker_config.text_config.num_key_value_heads": 2,
    "talker_config.text_config.head_dim": 16, "talker_config.text_config.intermediate_size": 128,
    "talker_config.text_config.moe_intermediate_size": 32, "talker_config.text_config.num_experts": 8,
    "talker_config.text_config.num_experts_per_tok": 2, "talker_config.text_config.shared_expert_intermediate_size": 64,
    "talker_config.text_config.rope_parameters.mrope_section": [4, 2, 2],
    "talker_config.code_predictor_config.hidden_size": 64, "talker_config.code_predictor_config.num_hidden_layers": 1,
    "talker_config.code_predictor_config.num_attention_heads": 4,
    "talker_config.code_predictor_config.num_key_value_heads": 2, "talker_config.code_predictor_config.head_dim": 16,
    "talker_config.code_predictor_config.intermediate_size": 128,
    "code2wav_config.hidden_size": 64, "code2wav_config.num_hidden_layers": 1, "code2wav_config.num_attention_heads": 4,
    "code2wav_config.num_key_value_heads": 4, "code2wav_config.intermediate_size": 128,
    "code2wav_config.decoder_dim": 64, "code2wav_config.sliding_window": 8,
}
ARGS = {"shapes": "qwen3-omni-30b-a3b", "shrink": SHRINK, "dtype": "float32", "seed": 5}


def test_the_real_config_has_qwen3_omni_30b_a3b_shapes():
    config = real_config()
    thinker, talker = config.thinker_config.text_config, config.talker_config
    assert (thinker.num_hidden_layers, thinker.hidden_size, thinker.num_experts, thinker.num_experts_per_tok) == (
        48, 2048, 128, 8)
    assert (talker.text_config.num_hidden_layers, talker.text_config.hidden_size, talker.text_config.num_experts,
            talker.text_config.num_experts_per_tok) == (20, 1024, 128, 6)
    assert talker.code_predictor_config.num_hidden_layers == 5
    assert talker.num_code_groups == config.code2wav_config.num_quantizers == 16
    assert talker.text_config.vocab_size == config.code2wav_config.codebook_size + 1024
    assert config.thinker_config.audio_config.encoder_layers == 32
    with pytest.raises(ValueError, match="unknown shapes"):
        real_config("qwen9")


def test_parts_build_with_random_weights_every_matrix_drawn_from_the_seed():
    first, config = load("talker", ARGS, "cpu")
    again, _ = load("talker", ARGS, "cpu")
    assert config.talker_config.text_config.hidden_size == 64
    for (name, a), (_, b) in zip(sorted(first.named_parameters()), sorted(again.named_parameters())):
        assert torch.equal(a, b), name  # transformers leaves some expert tensors empty: all are filled
        assert torch.isfinite(a).all(), name
    experts = [p for n, p in first.named_parameters() if ".experts." in n and p.ndim == 3]
    assert experts and all(0.01 < float(p.detach().std()) < 0.03 for p in experts)


def test_a_fused_turn_at_shrunk_real_shapes_has_its_fixed_length():
    from duplex_tools.qwen3_omni.fused import FusedOmni

    fused = FusedOmni(dict(ARGS), system_ids=[2610, 525, 264], thinker_max_len=256, talker_max_len=256,
                      ignore_eos=True)
    request = TurnRequest(session_id="s", max_new_tokens=5, options={"talker_max_new_tokens": 7})
    audio = (0.1 * np.random.default_rng(0).standard_normal(16000)).astype(np.float32)
    turn = fused.run_turn(audio, request)
    assert len(turn.tokens) == 5  # end-of-sequence ignored: as many tokens as asked
    assert turn.audio_samples > 0 and turn.first_audio_s <= turn.total_s
    # 7 talker steps, the last one ends the turn without a frame (as generate() does): 6 frames,
    # less the tail each code2wav call holds back for the next one.
    assert turn.audio_samples == 6 * 1920 - fused.vocoder.holdback
