"""Thinker step runner for the ``ar`` scheduler: batched chunked prefill and greedy decode.

Prompt per turn (Qwen3-Omni chat layout, audio only):
``<im_start>system\\n ... <im_end>\\n <im_start>user\\n <audio_start> AUDIO... <audio_end><im_end>\\n
<im_start>assistant\\n``. The system part and the user header prefill at once; audio embeddings
prefill as the encoder ships them (while the user is still speaking); the end of input prefills
the tail and samples the first token. Positions are explicit per row (audio-only prompts use
sequential positions on all three rotary axes), never taken from state kept on the module.

Each generated token is emitted with its input embedding, which is what the talker speaks from;
the first one also carries the talker's prefix (the user turn's embeddings and the hidden states
at ``accept_hidden_layer``, the assistant header, the tts bos/eos/pad embeddings).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from duplex.models.qwen3_omni.graphs import buckets_for
from duplex.models.qwen3_omni.loading import SpecialTokens, cache_kwargs
from duplex.models.qwen3_omni.payloads import AudioEmbeds, TalkerPrefix, TextToken, ThinkerStep
from duplex.models.qwen3_omni.slot_kv import DeviceSlotKV
from duplex.models.qwen3_omni.thinker_graph import ThinkerGraphs
from duplex.runtime.contract import Request, RowOutput, SlotBatch, SlotKVCache

DEFAULT_MAX_NEW_TOKENS = 64


@dataclass
class _Piece:
    """A span of the prompt: token ids or audio embeddings, one of the two."""

    ids: list[int] | None = None
    embeds: torch.Tensor | None = None  # (n, hidden) audio embeddings
    role: str = "user"  # system | user | assistant

    @property
    def length(self) -> int:
        return len(self.ids) if self.ids is not None else int(self.audio.shape[0])

    @property
    def audio(self) -> torch.Tensor:
        """The embeddings of a piece that has no ids."""
        assert self.embeds is not None  # every piece is made with ids or with embeddings
        return self.embeds


@dataclass
class _Row:
    request_id: str
    max_new_tokens: int
    eos_ids: set[int]
    pending: list[_Piece] = field(default_factory=list)
    position: int = 0
    input_ended: bool = False
    sampled_first: bool = False  # the final prefill is planned
    planned_tokens: int = 0
    generated: int = 0
    user_embeds: list[torch.Tensor] = field(default_factory=list)
    user_hidden: list[torch.Tensor] = field(default_factory=list)
    user_mm: list[torch.Tensor] = field(default_factory=list)
    assistant_embeds: torch.Tensor | None = None


@dataclass
class _PrefillRow:
    slot: int
    start: int
    pieces: list[_Piece]
    sample: bool
    row: _Row  # who planned it: an aborted row's slot may have a new owner when this resolves


@dataclass
class ThinkerPlan:
    prefill: list[_PrefillRow]
    decode: list[tuple[int, int]]  # (slot, position)
    decode_rows: list[_Row] = field(default_factory=list)


class ThinkerRunner:
    releases_in_flight = True  # resolve skips rows it did not plan; open touches no tensor

    def __init__(self, lm, config, tokens: SpecialTokens, *, memory_bytes: int | None, max_len: int = 1024,
                 max_slots: int = 16, system_ids: list[int] | None = None, detokenize=None,
                 device: str = "cpu", ignore_eos: bool = False, graphs: list[int] | bool | None = None) -> None:
        text = config.thinker_config.text_config
        self.lm, self.tokens, self.device = lm, tokens, device
        self.dtype = lm.lm_head.weight.dtype
        self.accept_layer = config.talker_config.accept_hidden_layer
        self.max_len = max_len
        # Benches ask for replies of a fixed length (random weights would end them anywhere).
        self.ignore_eos = ignore_eos
        per_slot = SlotKVCache.bytes_per_slot(text.num_hidden_layers, text.num_key_value_heads, text.head_dim, max_len,
                                              dtype_bytes=self.dtype.itemsize)
        slots = max_slots if memory_bytes is None else min(max_slots, memory_bytes // per_slot)
        if slots < 1:
            raise ValueError(f"thinker: memory budget {memory_bytes} B holds no KV slot of {per_slot} B "
                             f"(max_len {max_len})")
        self.capacity = int(slots)
        # One spare slot (index ``capacity``, never handed out) for the padding rows of graph buckets.
        self.kv = DeviceSlotKV(text.num_hidden_layers, text.num_key_value_heads, text.head_dim, self.capacity + 1,
                               max_len, dtype=self.dtype, device=device)
        self.last_token = torch.zeros(self.capacity + 1, dtype=torch.long, device=device)
        self.system_ids = list(system_ids or [])
        self.detokenize = detokenize or (lambda token: f"<{token}>")
        self.rows: dict[int, _Row] = {}
        with torch.no_grad():
            ids = torch.tensor([tokens.tts_bos, tokens.tts_eos, tokens.tts_pad], device=device)
            # Outputs stay on the stage's device: the relay moves device tensors between stages.
            self.tts_embeds = lm.model.embed_tokens(ids)
        sizes = buckets_for(graphs, device, self.capacity)
        self.graphs = ThinkerGraphs(self, sizes) if sizes else None
        self.graph_error = self.graphs.error if self.graphs is not None else None
        if self.graphs is not None and not self.graphs.buckets:
            self.graphs = None  # capture failed (logged): eager steps

    # -- StepRunner protocol ---------------------------------------------------------------------
    def open(self, slot: int, request_id: str, request: Request) -> None:
        t = self.tokens
        row = _Row(request_id, getattr(request, "max_new_tokens", None) or DEFAULT_MAX_NEW_TOKENS,
                   set() if self.ignore_eos else {t.im_end})
        system = [t.im_start, t.system, t.newline, *self.system_ids, t.im_end, t.newline]
        row.pending = [_Piece(ids=system, role="system"), _Piece(ids=[t.im_start, t.user, t.newline, t.audio_start])]
        self.rows[slot] = row

    def feed(self, slot: int, source: str, data: Any, eos: bool) -> None:
        row = self.rows[slot]
        if row.input_ended:
            raise ValueError("input after the end of the user turn")
        embeds = data.embeds if isinstance(data, AudioEmbeds) else None
        if embeds is not None:
            embeds = torch.as_tensor(embeds).to(self.device, self.dtype)
            if embeds.ndim != 2 or embeds.shape[1] != self.lm.model.config.hidden_size:
                raise ValueError(f"audio_embeds must be (n, {self.lm.model.config.hidden_size}), "
                                 f"got {tuple(embeds.shape)}")
            row.pending.append(_Piece(embeds=embeds))
        elif data is not None and not eos:
            raise ValueError(f"thinker input needs AudioEmbeds, got {type(data).__name__}")
        if eos:
            t = self.tokens
            row.input_ended = True
            row.pending.append(_Piece(ids=[t.audio_end, t.im_end, t.newline]))
            row.pending.append(_Piece(ids=[t.im_start, t.assistant, t.newline], role="assistant"))
        total = row.position + sum(p.length for p in row.pending)
        if total + row.max_new_tokens > self.max_len:
            raise ValueError(f"prompt of {total} positions + {row.max_new_tokens} new tokens exceeds {self.max_len}")

    def ready(self, slot: int) -> bool:
        row = self.rows[slot]
        if row.pending:
            return True
        return row.sampled_first and row.planned_tokens < row.max_new_tokens

    def plan(self, slots: list[int]) -> ThinkerPlan:
        plan = ThinkerPlan([], [])
        for slot in slots:
            row = self.rows[slot]
            if row.pending:
                sample = row.input_ended
                plan.prefill.append(_PrefillRow(slot, row.position, row.pending, sample, row))
                row.position += sum(p.length for p in row.pending)
                row.pending = []
                if sample:
                    row.sampled_first, row.planned_tokens = True, 1
            else:
                plan.decode.append((slot, row.position))
                plan.decode_rows.append(row)
                row.position += 1
                row.planned_tokens += 1
        return plan

    @torch.no_grad()
    def compute(self, plan: ThinkerPlan) -> dict:
        raw: dict[str, Any] = {}
        if plan.prefill:
            raw["prefill"] = self._prefill(plan.prefill)
        if plan.decode:
            raw["decode"] = self._decode(plan.decode)
        return raw

    def resolve(self, plan: ThinkerPlan, raw: dict) -> dict[int, RowOutput]:
        outputs: dict[int, RowOutput] = {}
        for prow, (embeds, hidden, token) in zip(plan.prefill, raw.get("prefill", [])):
            row = prow.row
            if self.rows.get(prow.slot) is not row:
                continue  # aborted while this step computed
            self._keep_talker_parts(row, prow.pieces, embeds, hidden)
            outputs[prow.slot] = self._token_output(row, token, first=True) if token is not None else RowOutput()
        for (slot, _), row, token in zip(plan.decode, plan.decode_rows, raw.get("decode", [])):
            if self.rows.get(slot) is row:
                outputs[slot] = self._token_output(row, token, first=False)
        return outputs

    def close(self, slot: int) -> None:
        del self.rows[slot]

    def held(self) -> dict[str, int]:
        return {"prompt_rows": len(self.rows)}

    # -- compute ----------------------------------------------------------------------------------
    def _embed_pieces(self, pieces: list[_Piece]) -> torch.Tensor:
        parts = []
        for piece in pieces:
            if piece.ids is not None:
                parts.append(self.lm.model.embed_tokens(torch.tensor(piece.ids, device=self.device)))
            else:
                parts.append(piece.audio.to(self.device))
        return torch.cat(parts, dim=0)

    def _forward(self, embeds: torch.Tensor, batch: SlotBatch, hidden_states: bool):
        mask = self.kv.bind(batch)["full_attention"]
        positions = batch.position_ids().to(self.device)
        return self.lm.model(inputs_embeds=embeds, attention_mask=mask, position_ids=positions,
                             use_cache=True, output_hidden_states=hidden_states, **cache_kwargs(self.lm.model, self.kv))

    def _prefill(self, rows: list[_PrefillRow]) -> list[tuple[torch.Tensor, torch.Tensor, int | None]]:
        inputs = [self._embed_pieces(r.pieces) for r in rows]
        lengths = [x.shape[0] for x in inputs]
        if self.graphs is not None and self.graphs.fits_prefill(len(rows), max(lengths)):
            replayed = self.graphs.prefill([r.slot for r in rows], [r.start for r in rows], inputs)
            return [(x, accept, token if r.sample else None) for x, r, (accept, token) in zip(inputs, rows, replayed)]
        width = max(lengths)
        padded = torch.stack([torch.nn.functional.pad(x, (0, 0, 0, width - x.shape[0])) for x in inputs])
        batch = SlotBatch.of([r.slot for r in rows], [r.start for r in rows], lengths)
        out = self._forward(padded, batch, hidden_states=True)
        accept = out.hidden_states[self.accept_layer]
        results = []
        for b, (r, n) in enumerate(zip(rows, lengths)):
            token = None
            if r.sample:
                logits = self.lm.lm_head(out.last_hidden_state[b, n - 1])
                token_t = logits.argmax(-1)
                self.last_token[r.slot] = token_t
                token = int(token_t)
            results.append((inputs[b], accept[b, :n], token))
        return results

    def _decode(self, rows: list[tuple[int, int]]) -> list[int]:
        if self.graphs is not None:
            return self.graphs.run(rows)
        slots = [slot for slot, _ in rows]
        slot_index = torch.tensor(slots, device=self.device)
        embeds = self.lm.model.embed_tokens(self.last_token[slot_index])[:, None, :]
        batch = SlotBatch.of(slots, [pos for _, pos in rows], [1] * len(rows))
        out = self._forward(embeds, batch, hidden_states=False)
        tokens = self.lm.lm_head(out.last_hidden_state[:, -1]).argmax(-1)
        self.last_token[slot_index] = tokens
        return tokens.tolist()

    # -- outputs ----------------------------------------------------------------------------------
    def _keep_talker_parts(self, row: _Row, pieces: list[_Piece], embeds: torch.Tensor, hidden: torch.Tensor) -> None:
        offset = 0
        for piece in pieces:
            span = slice(offset, offset + piece.length)
            offset += piece.length
            if piece.role == "user":
                row.user_embeds.append(embeds[span])
                row.user_hidden.append(hidden[span])
                row.user_mm.append(torch.full((piece.length,), piece.embeds is not None))
            elif piece.role == "assistant":
                row.assistant_embeds = embeds[span]

    def _token_output(self, row: _Row, token: int, first: bool) -> RowOutput:
        with torch.no_grad():
            embed = self.lm.model.embed_tokens(torch.tensor([token], device=self.device))
        row.generated += 1
        prefix = None
        if first:
            prefix = TalkerPrefix(user_embeds=torch.cat(row.user_embeds), user_hidden=torch.cat(row.user_hidden),
                                  user_mm=torch.cat(row.user_mm), assistant_embeds=row.assistant_embeds,
                                  tts_embeds=self.tts_embeds)
        data = ThinkerStep(TextToken(self.detokenize(token), token_ids=[token]), embed, prefix)
        if token in row.eos_ids or row.generated >= row.max_new_tokens:
            return RowOutput(done=True, final=data)
        return RowOutput(emits=[data])
