"""Gemma 3 270M on CPU: load the converted folder, run prefill and batched decode over KV slots.

Tensors only: prompts, sampling, stop rules and sessions live in ``thinker.py``. Every forward
passes explicit position ids and attention masks built from the slots (``kv_slots.py``), and
asks for logits of the last position only: the 262k-word output layer is about half the cost of
a decode step, and the other positions' logits would be thrown away.
"""

from __future__ import annotations

import time
import warnings
from pathlib import Path

import torch

from duplex.models.local.kv_slots import KVPrefix, SlotBatch, SlotKVCache


class GemmaModel:
    def __init__(self, model_dir: Path, num_slots: int, max_len: int, quantize: str = "none") -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        started = time.monotonic()
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        self.model.eval()
        if quantize == "int8":
            self._quantize_output_layer()
        elif quantize != "none":
            raise ValueError(f"quantize: {quantize!r} (use none or int8)")
        self.load_seconds = time.monotonic() - started
        config = self.model.config
        self.cache = SlotKVCache(
            num_layers=config.num_hidden_layers,
            num_kv_heads=config.num_key_value_heads,
            head_dim=config.head_dim,
            num_slots=num_slots,
            max_len=max_len,
            layer_types=list(config.layer_types),
            sliding_window=config.sliding_window,
        )
        self.bos_id = self.tokenizer.bos_token_id
        self.stop_ids = {self.tokenizer.eos_token_id}
        end_of_turn = self.tokenizer.convert_tokens_to_ids("<end_of_turn>")
        if isinstance(end_of_turn, int) and end_of_turn != self.tokenizer.unk_token_id:
            self.stop_ids.add(end_of_turn)

    def _quantize_output_layer(self) -> None:
        """Dynamic int8 for the 262k-word output layer only: it is ~half of each decode step.

        Measured on the persona prompts: int8 on every linear (per-tensor or per-channel)
        changed what the replies say (Gemma's activations have outliers); the output layer alone
        keeps the greedy replies."""
        qconfig = torch.ao.quantization.per_channel_dynamic_qconfig
        with warnings.catch_warnings():
            # torch 2.13 warns that quantized tensors will go in a later release; the torch pin
            # in pyproject keeps this path working until then.
            warnings.filterwarnings("ignore", message=".*quantized tensor creation functions.*")
            warnings.filterwarnings("ignore", message="torch.ao.quantization is deprecated", category=DeprecationWarning)
            self.model = torch.ao.quantization.quantize_dynamic(self.model, {"lm_head": qconfig}, dtype=torch.qint8)

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
        masks = self.cache.begin(batch)
        out = self.model(input_ids=token_ids, position_ids=batch.position_ids(), attention_mask=masks,
                         cache=self.cache, use_cache=True, logits_to_keep=1)
        return out.logits[:, -1, :].float()

    def prefill(self, slot: int, start: int, token_ids: list[int]) -> torch.Tensor:
        batch = SlotBatch(torch.tensor([slot]), torch.tensor([start]), q_len=len(token_ids))
        return self.forward(torch.tensor([token_ids]), batch)[0]

    def decode(self, slots: list[int], positions: list[int], tokens: list[int]) -> torch.Tensor:
        batch = SlotBatch(torch.tensor(slots), torch.tensor(positions), q_len=1)
        return self.forward(torch.tensor(tokens)[:, None], batch)

    def compute_prefix(self, token_ids: list[int], scratch_slot: int = 0) -> KVPrefix:
        """KV of a prefix every request shares (the persona), computed once in a scratch slot."""
        self.prefill(scratch_slot, 0, token_ids)
        return self.cache.read_prefix(scratch_slot, len(token_ids))
