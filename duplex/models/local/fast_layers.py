"""Cheaper layers for Gemma's decode step on a laptop CPU.

A decode step reads every weight once for one row of activations, so it is bound by memory
bandwidth (measured ~9 GB/s here, one thread or two): fewer weight bytes, faster steps.

- ``use_fp16_weights``: the transformer layers' linear weights in fp16, activations, products'
  sums and outputs in fp32 (fbgemm's fp16 GEMM converts weights on the fly). Half the bytes:
  a 1-row call over 80 2048x640 matrices took 19 ms vs 50 ms in fp32, a 13-row prefill 48 vs
  104 ms; on the persona prompts the greedy replies stayed the same (one grew by a question).
- ``SpeakableHead``: the output layer scores only tokens the voice can speak (ASCII words,
  digits, common punctuation, the line break and the stop tokens): 141k of the 262k, int8, so it
  costs ~10 ms of a step instead of ~20. Other tokens get -inf: greedy decoding then picks the
  best speakable token, which is what an English voice needs anyway.

Tried and dropped (measured on the persona prompts): bf16 weights with bf16 matmuls (bf16
outputs flipped near-ties: a price became "$10" instead of the persona's "five dollars", and
replies changed with the batch size), and int8 on every linear (replies changed: Gemma's
activations have outliers, and dynamic int8 quantizes activations too).
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

# Characters a reply may be made of; a token with any other character is never produced.
_SPEAKABLE_TOKEN = re.compile(r"^[A-Za-z0-9 .,!?'\"$%&:;()/\-\n]+$")
_WORD_BOUNDARY = "\u2581"  # SentencePiece's mark for a leading space


def speakable_token_ids(pieces: list[str | None], always: set[int]) -> list[int]:
    """Ids of tokens whose text is all speakable characters, plus ``always`` (stop tokens)."""
    ids = {i for i, piece in enumerate(pieces)
           if piece and _SPEAKABLE_TOKEN.match(piece.replace(_WORD_BOUNDARY, " "))}
    return sorted(ids | always)


class SpeakableHead(nn.Module):
    """An output layer over a subset of the vocabulary (int8 weights), scattered back to full size."""

    def __init__(self, weight: torch.Tensor, token_ids: list[int], quantize_int8: bool = True) -> None:
        super().__init__()
        self.vocab_size = weight.shape[0]
        ids = torch.tensor(token_ids, dtype=torch.long)
        self.register_buffer("token_ids", ids, persistent=False)
        head = nn.Linear(weight.shape[1], len(token_ids), bias=False)
        head.weight = nn.Parameter(weight.detach()[ids].clone(), requires_grad=False)
        self.head = _int8(head) if quantize_int8 else head

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        scores = self.head(hidden.float())
        logits = scores.new_full((*scores.shape[:-1], self.vocab_size), float("-inf"))
        return logits.index_copy_(-1, self.token_ids, scores)


def use_fp16_weights(layers: nn.Module) -> nn.Module:
    """Every ``nn.Linear`` under ``layers`` with fp16 weights and fp32 activations (fbgemm)."""
    qconfig = torch.ao.quantization.float16_dynamic_qconfig
    with _quiet_quantization():
        return torch.ao.quantization.quantize_dynamic(layers, {nn.Linear: qconfig}, dtype=torch.float16)


def _int8(linear: nn.Linear) -> nn.Module:
    """Dynamic int8 with per-channel weight scales (fbgemm): a quarter of the fp32 bytes."""
    qconfig = torch.ao.quantization.per_channel_dynamic_qconfig
    with _quiet_quantization():
        wrapper = nn.Sequential(linear)
        return torch.ao.quantization.quantize_dynamic(wrapper, {nn.Linear: qconfig}, dtype=torch.qint8)[0]


@contextmanager
def _quiet_quantization() -> Iterator[None]:
    with warnings.catch_warnings():
        # torch 2.13 warns that quantized tensors will go in a later release; the torch pin
        # in pyproject keeps this path working until then.
        warnings.filterwarnings("ignore", message=".*quantized tensor creation functions.*")
        warnings.filterwarnings("ignore", message="torch.ao.quantization is deprecated", category=DeprecationWarning)
        yield
