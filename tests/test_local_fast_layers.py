"""The Gemma decode-step layers (duplex/models/local/fast_layers.py) on small random matrices:
fp16-weight linears, which tokens count as speakable, and what the speakable head computes."""

from __future__ import annotations

import torch
from torch import nn

from duplex.models.local.fast_layers import SpeakableHead, speakable_token_ids, use_fp16_weights


def test_speakable_tokens_are_english_words_digits_punctuation_and_the_stops():
    pieces = ["<pad>", "<eos>", "\u2581Hello", ",", "\u2581caf\u00e9", "\u3053\u3093", "\n", "\u2581$5", "{", None,
              "<b>"]
    assert speakable_token_ids(pieces, always={1}) == [1, 2, 3, 6, 7]


def test_the_speakable_head_scores_only_its_tokens_and_matches_the_full_layer_there():
    weight = torch.randn(50, 16)
    allowed = [0, 3, 7, 19, 42]
    head = SpeakableHead(weight, allowed, quantize_int8=False)
    hidden = torch.randn(2, 1, 16)
    logits = head(hidden)
    assert logits.shape == (2, 1, 50)
    full = hidden @ weight.T
    torch.testing.assert_close(logits[..., allowed], full[..., allowed])
    banned = [i for i in range(50) if i not in allowed]
    assert torch.isinf(logits[..., banned]).all() and (logits[..., banned] < 0).all()
    assert set(logits.argmax(-1).flatten().tolist()) <= set(allowed)


def test_the_int8_speakable_head_stays_close_to_fp32():
    generator = torch.Generator().manual_seed(0)  # the same weights every run: the bound holds for these, not for luck
    weight = torch.randn(300, 64, generator=generator)
    allowed = list(range(0, 300, 3))
    hidden = torch.randn(1, 1, 64, generator=generator)
    exact = SpeakableHead(weight, allowed, quantize_int8=False)(hidden)[..., allowed]
    int8 = SpeakableHead(weight, allowed, quantize_int8=True)(hidden)[..., allowed]
    torch.testing.assert_close(int8, exact, atol=0.3, rtol=0.05)


def test_fp16_weights_replace_every_linear_and_keep_fp32_results_close():
    torch.manual_seed(0)
    block = nn.Sequential(nn.Linear(64, 128), nn.GELU(),
                          nn.Sequential(nn.Linear(128, 32, bias=False), nn.LayerNorm(32)))
    x = torch.randn(3, 64)
    exact = block(x)
    half = use_fp16_weights(block)
    assert not any(type(m) is nn.Linear for m in half.modules())  # all swapped
    assert isinstance(half[1], nn.GELU) and isinstance(half[2][1], nn.LayerNorm)
    got = half(x)
    assert got.dtype == torch.float32 and got.shape == exact.shape
    torch.testing.assert_close(got, exact, atol=5e-3, rtol=5e-3)
    torch.testing.assert_close(half(x[:1]), got[:1], atol=1e-5, rtol=1e-5)  # batch mates barely matter
