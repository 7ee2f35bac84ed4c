"""Gemma 3 270M on CPU: load the converted folder, run prefill and batched decode over KV slots.

Tensors only: prompts, sampling, stop rules and sessions live in ``thinker.py``. Every forward
passes explicit position ids and attention masks built from the slots (the runtime's
``SlotKVCache``), and
asks for logits of the last position only: the 262k-word output layer is about half the cost of
a decode step, and the other positions' logits would be thrown away.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import cast

import torch

from duplex.models.local.fast_layers import SpeakableHead, speakable_token_ids, use_fp16_weights
from duplex.runtime.contract import KVPrefix, SlotBatch, SlotKVCache


class GemmaModel:
    """``quantize``: ``int8`` output layer or ``none`` (fp32). ``vocabulary``: ``speakable``
    scores only tokens a voice can say (``fast_layers.SpeakableHead``), ``full`` all 262k.
    ``layer_weights``: ``fp16`` stores the transformer layers' linear weights in half precision
    (activations and sums stay fp32), ``fp32`` keeps them as loaded."""

    def __init__(self, model_dir: Path, num_slots: int, max_len: int, quantize: str = "none",
                 vocabulary: str = "full", layer_weights: str = "fp32") -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        _check_choice("quantize", quantize, ("none", "int8"))
        _check_choice("vocabulary", vocabulary, ("full", "speakable"))
        _check_choice("layer_weights", layer_weights, ("fp32", "fp16"))
        started = time.monotonic()
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        self.model.eval()
        self.bos_id = self.tokenizer.bos_token_id
        self.stop_ids = {self.tokenizer.eos_token_id}
        end_of_turn = self.tokenizer.convert_tokens_to_ids("<end_of_turn>")
        if isinstance(end_of_turn, int) and end_of_turn != self.tokenizer.unk_token_id:
            self.stop_ids.add(end_of_turn)
        self._swap_output_layer(quantize, vocabulary)
        if layer_weights == "fp16":
            self.model.model.layers = use_fp16_weights(self.model.model.layers)
        self.load_seconds = time.monotonic() - started
        config = self.model.config
        self.cache = SlotKVCache(
            num_layers=config.num_hidden_layers,
            num_kv_heads=config.num_key_value_heads,
            head_dim=config.head_dim,
            num_slots=num_slots,
            max_len=max_len,
            sliding_window=config.sliding_window,
        )

    def _swap_output_layer(self, quantize: str, vocabulary: str) -> None:
        """The 262k-word output layer is the largest matrix of a decode step. Measured on the
        persona prompts: int8 on every linear changed what the replies say (Gemma's activations
        have outliers); int8 on the output layer alone keeps the greedy replies."""
        weight = self.model.get_output_embeddings().weight
        if vocabulary == "speakable":
            pieces = cast(list[str | None], self.tokenizer.convert_ids_to_tokens(list(range(weight.shape[0]))))
            ids = speakable_token_ids(pieces, always=self.stop_ids)
        elif quantize == "int8":
            ids = list(range(weight.shape[0]))
        else:
            return
        self.model.set_output_embeddings(SpeakableHead(weight, ids, quantize_int8=quantize == "int8"))

    @staticmethod
    def bytes_per_slot(model_dir: Path, max_len: int) -> int:
        """KV bytes one slot takes, from the model's config (to size slots from a memory budget)."""
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(model_dir)
        return SlotKVCache.bytes_per_slot(config.num_hidden_layers, config.num_key_value_heads,
                                          config.head_dim, max_len)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False).input_ids

    @torch.inference_mode()
    def forward(self, token_ids: torch.Tensor, batch: SlotBatch) -> torch.Tensor:
        """Run ``token_ids`` (B, q) at the batch's slots/positions; last-position logits (B, vocab)."""
        masks = self.cache.bind(batch)
        out = self.model(input_ids=token_ids, position_ids=batch.position_ids(), attention_mask=masks,
                         cache=self.cache, use_cache=True, logits_to_keep=1)
        return out.logits[:, -1, :].float()

    def prefill(self, slot: int, start: int, token_ids: list[int]) -> torch.Tensor:
        batch = SlotBatch.of([slot], [start], [len(token_ids)])
        return self.forward(torch.tensor([token_ids]), batch)[0]

    def decode(self, slots: list[int], positions: list[int], tokens: list[int]) -> torch.Tensor:
        batch = SlotBatch.of(slots, positions, [1] * len(slots))
        return self.forward(torch.tensor(tokens)[:, None], batch)

    def compute_prefix(self, token_ids: list[int], scratch_slot: int = 0) -> KVPrefix:
        """KV of a prefix every request shares (the persona), computed once in a scratch slot."""
        self.prefill(scratch_slot, 0, token_ids)
        return self.cache.read_prefix(scratch_slot, len(token_ids))


def _check_choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name}: {value!r} (use one of {', '.join(allowed)})")
