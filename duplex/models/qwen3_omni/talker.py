"""Talker + code predictor step runner for the ``feedback_ar`` scheduler.

One ``compute`` call per step does, for every row at once: the talker forward (prefill rows and
decode rows), codebook 0 (greedy, with generate()'s repetition penalty and suppressed control
ids), the code predictor's 15 residual codebooks (one 2-position call, then 14 one-token calls
batched over rows), and the feedback write: the sum of the frame's 16 codec embeddings goes to
the row's feedback buffer, which the next step adds to that step's text input.

Text input (matching ``Qwen3OmniMoeForConditionalGeneration.generate``): the prefill is the user
turn (thinker hidden states for audio positions, projected embeddings for text positions)
followed by the assistant header over the codec control ids; the first reply token rides in the
prefill. Decode step f (f >= 1) adds the reply token f+1, then tts_eos in place of the thinker's
last token, then tts_pad. A row is ready only when that input is there: the talker starts after
the thinker's first token and needs reply token f+1 for step f, no more (a token that arrives
without the thinker's end of stream is known not to be the last one, so it need not wait for
the next token to tell).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from transformers import DynamicCache

from duplex.models.qwen3_omni.graphs import buckets_for
from duplex.models.qwen3_omni.loading import cache_kwargs
from duplex.models.qwen3_omni.payloads import CodecChunk, TalkerPrefix, ThinkerStep
from duplex.models.qwen3_omni.slot_kv import DeviceSlotKV
from duplex.models.qwen3_omni.talker_graph import TalkerGraphs
from duplex.runtime.contract import Request, RowOutput, SlotBatch, SlotKVCache, TurnRequest

DEFAULT_MAX_FRAMES = 250  # 20 s of speech
_ASSISTANT_PREFIX = 9  # header (3) + tts_pad (4) + tts_bos + first reply token


@dataclass
class _Row:
    request_id: str
    max_new_tokens: int
    speaker_id: int
    prefix: TalkerPrefix | None = None  # from the thinker's first step
    texts: list[torch.Tensor] = field(default_factory=list)  # thinker embeddings of reply tokens
    thinker_done: bool = False
    prefilled: bool = False
    position: int = 0
    planned_steps: int = 0  # code-0 tokens planned so far
    resolved_steps: int = 0
    next_frame: int = 0
    pending_frames: list[np.ndarray] = field(default_factory=list)
    emitted_frames: int = 0


@dataclass
class TalkerPlan:
    prefill: list[tuple[int, TalkerPrefix, torch.Tensor, int]]  # (slot, thinker prefix, first reply token, speaker)
    decode: list[tuple[int, int, torch.Tensor]]  # (slot, position, text embedding for this step)
    rows: dict[int, _Row] = field(default_factory=dict)  # who planned each slot (it may change owner)


class TalkerRunner:
    releases_in_flight = True  # resolve skips rows it did not plan; open leaves tensors to compute

    def __init__(self, talker, config, *, memory_bytes: int | None, max_len: int = 2048, max_slots: int = 16,
                 first_chunk_frames: int = 2, chunk_frames: int = 6, speaker: str = "ethan",
                 device: str = "cpu", graphs: list[int] | bool | None = None, ignore_eos: bool = False) -> None:
        tcfg = config.talker_config
        text = tcfg.text_config
        self.talker, self.tcfg, self.device = talker, tcfg, device
        self.dtype = talker.codec_head.weight.dtype
        self.num_groups = tcfg.num_code_groups
        self.vocab = text.vocab_size
        per_slot = SlotKVCache.bytes_per_slot(text.num_hidden_layers, text.num_key_value_heads, text.head_dim, max_len,
                                              dtype_bytes=self.dtype.itemsize)
        slots = max_slots if memory_bytes is None else min(max_slots, memory_bytes // per_slot)
        if slots < 1:
            raise ValueError(f"talker: memory budget {memory_bytes} B holds no KV slot of {per_slot} B")
        self.capacity = int(slots)
        self.max_len = max_len
        # One spare slot (index ``capacity``, never handed out): the padding rows of a graph's
        # batch bucket write their K/V, feedback and seen codes there.
        rows = self.capacity + 1
        self.kv = DeviceSlotKV(text.num_hidden_layers, text.num_key_value_heads, text.head_dim, rows, max_len,
                               dtype=self.dtype, device=device)
        self.feedback = torch.zeros(rows, text.hidden_size, dtype=self.dtype, device=device)
        self.seen = torch.zeros(rows, self.vocab, dtype=torch.bool, device=device)
        suppress = torch.zeros(self.vocab, dtype=torch.bool, device=device)
        suppress[self.vocab - 1024:] = True
        # With ignore_eos (benches: replies of a fixed length) end-of-speech is never picked.
        suppress[tcfg.codec_eos_token_id] = ignore_eos
        self.suppress = suppress
        self._true = torch.ones((), dtype=torch.bool, device=device)
        self.repetition_penalty = 1.05  # generate()'s talker default
        self.first_chunk_frames, self.chunk_frames = first_chunk_frames, chunk_frames
        self.default_speaker = speaker
        self.rows: dict[int, _Row] = {}
        sizes = buckets_for(graphs, device, self.capacity)
        self.graphs = TalkerGraphs(self, sizes) if sizes else None
        self.graph_error = self.graphs.error if self.graphs is not None else None
        if self.graphs is not None and not self.graphs.buckets:
            self.graphs = None  # capture failed (logged): eager steps

    # -- StepRunner protocol ---------------------------------------------------------------------
    def open(self, slot: int, request_id: str, request: Request) -> None:
        options = request.options if isinstance(request, TurnRequest) else {}  # per-request knobs (benches)
        speaker = str(options.get("speaker", self.default_speaker)).lower()
        if speaker not in self.tcfg.speaker_id:
            speaker = self.default_speaker
        max_new = int(options.get("talker_max_new_tokens", DEFAULT_MAX_FRAMES + 1))
        # The slot's seen/feedback rows are reset by this row's prefill compute, on the worker,
        # after any step of a previous owner that is still in flight.
        self.rows[slot] = _Row(request_id, max_new, self.tcfg.speaker_id[speaker])

    def feed(self, slot: int, source: str, data: Any, eos: bool) -> None:
        row = self.rows[slot]
        if data is not None:
            if not isinstance(data, ThinkerStep):
                raise ValueError(f"talker input needs the thinker's ThinkerSteps, got {type(data).__name__}")
            if row.prefix is None:
                if data.talker_prefix is None:
                    raise ValueError("the thinker's first chunk must carry talker_prefix")
                row.prefix = data.talker_prefix
            row.texts.extend(torch.as_tensor(data.embeds).to(self.device, self.dtype).unbind(0))
        if eos:
            if row.prefix is None:
                raise ValueError("the thinker ended without a reply token")
            row.thinker_done = True

    def ready(self, slot: int) -> bool:
        row = self.rows[slot]
        if row.prefix is None or row.planned_steps >= row.max_new_tokens:
            return False
        if not row.prefilled:
            return True
        return self._text_for_step(row, row.planned_steps) is not None

    def plan(self, slots: list[int]) -> TalkerPlan:
        plan = TalkerPlan([], [])
        for slot in slots:
            row = self.rows[slot]
            if not row.prefilled:
                prefix = row.prefix
                assert prefix is not None  # a row without its prefix is never ready
                length = int(prefix.user_embeds.shape[0]) + _ASSISTANT_PREFIX
                if length + row.max_new_tokens > self.max_len:
                    raise ValueError(f"talker prefix of {length} + {row.max_new_tokens} exceeds {self.max_len}")
                plan.prefill.append((slot, prefix, row.texts[0], row.speaker_id))
                row.prefilled, row.position = True, length
            else:
                text = self._text_for_step(row, row.planned_steps)
                assert text is not None  # a prefilled row is ready only once its step's input is known
                plan.decode.append((slot, row.position, text))
                row.position += 1
            row.planned_steps += 1
            plan.rows[slot] = row
        return plan

    @torch.no_grad()
    def compute(self, plan: TalkerPlan) -> dict:
        if self.graphs is None:
            slots, code0, frames = self._compute_eager(plan)
        else:
            # Graphs: the whole decode step replays; a prefill's talker forward (its length varies)
            # runs eagerly and its codebook 0 + code predictor tail replays.
            parts = []
            if plan.prefill:
                hidden = self._forward_prefill_rows(plan.prefill)
                parts.append(self.graphs.run_tail([slot for slot, *_ in plan.prefill], hidden))
            if plan.decode:
                parts.append(self.graphs.run(plan.decode))
            slots = [slot for part in parts for slot in part[0]]
            code0, frames = torch.cat([p[1] for p in parts]), torch.cat([p[2] for p in parts])
        return {"slots": slots, "code0": code0.tolist(), "frames": frames.cpu().numpy()}

    def _compute_eager(self, plan: TalkerPlan) -> tuple[list[int], torch.Tensor, torch.Tensor]:
        hidden, slots = [], []
        if plan.prefill:
            hidden.append(self._forward_prefill_rows(plan.prefill))
            slots += [slot for slot, *_ in plan.prefill]
        if plan.decode:
            hidden.append(self._forward_decode(plan.decode))
            slots += [slot for slot, _, _ in plan.decode]
        last = torch.cat(hidden, dim=0)  # (B, hidden): each row's last position
        code0, residual = self.step_tail(last, torch.tensor(slots, device=self.device))
        return slots, code0, torch.cat([code0[:, None], residual], dim=1)

    def step_tail(self, last: torch.Tensor, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Codebook 0 and the code predictor's 15 from each row's last talker hidden state; the
        frame's feedback is written in place into the rows' feedback."""
        code0 = self._pick_code0(self.talker.codec_head(last), slots)
        residual, feedback = self._code_predictor(last, code0)
        self.feedback[slots] = feedback
        return code0, residual

    def _forward_prefill_rows(self, rows: list) -> torch.Tensor:
        fresh = torch.tensor([slot for slot, *_ in rows], device=self.device)
        self.seen[fresh] = False
        self.feedback[fresh] = 0
        return self._forward_prefill(rows)

    def resolve(self, plan: TalkerPlan, raw: dict) -> dict[int, RowOutput]:
        outputs = {}
        for slot, code0, frame in zip(raw["slots"], raw["code0"], raw["frames"]):
            row = plan.rows[slot]
            if self.rows.get(slot) is not row:
                continue  # aborted while this step computed
            row.resolved_steps += 1
            ended = code0 == self.tcfg.codec_eos_token_id or row.resolved_steps >= row.max_new_tokens
            if not ended:
                # generate() never expands the code-0 token it stops on into a frame.
                row.pending_frames.append(frame)
            outputs[slot] = self._chunk_output(row, ended)
        return outputs

    def close(self, slot: int) -> None:
        del self.rows[slot]

    def held(self) -> dict[str, int]:
        return {"feedback_rows": sum(1 for r in self.rows.values() if r.prefilled)}

    # -- inputs -----------------------------------------------------------------------------------
    def _text_for_step(self, row: _Row, step: int) -> torch.Tensor | None:
        """Unprojected text input for decode step ``step`` (>= 1), or None while not yet known."""
        assert row.prefix is not None  # asked only of prefilled rows
        tts_bos, tts_eos, tts_pad = row.prefix.tts_embeds
        index = step  # reply token ``step`` (0-based) is spoken at step ``step``
        if index + 1 < len(row.texts) or (index < len(row.texts) and not row.thinker_done):
            return row.texts[index]  # not the thinker's last token: a later one came, or its eos did not
        if not row.thinker_done:
            return None
        # The thinker's last token is never spoken: tts_eos takes its place, tts_pad follows.
        return tts_eos if index == len(row.texts) - 1 else tts_pad

    def _prefill_embeds(self, prefix: TalkerPrefix, first_token: torch.Tensor, speaker_id: int) -> torch.Tensor:
        """User turn, then the assistant header: 3 header tokens, 4 x tts_pad, tts_bos and the first
        reply token on the text side, over zeros and the codec control ids on the codec side."""
        talker, cfg = self.talker, self.tcfg
        mm = torch.as_tensor(prefix.user_mm, dtype=torch.bool, device=self.device)[:, None]
        user = torch.where(mm, talker.hidden_projection(prefix.user_hidden.to(self.device, self.dtype)),
                           self._project_text(prefix.user_embeds))
        header = self._project_text(prefix.assistant_embeds)
        tts_bos, _, tts_pad = self._project_text(prefix.tts_embeds).unbind(0)
        text_side = torch.cat([header[:3], tts_pad.expand(4, -1), tts_bos[None], self._project_text(first_token[None])])
        control = [cfg.codec_nothink_id, cfg.codec_think_bos_id, cfg.codec_think_eos_id, speaker_id,
                   cfg.codec_pad_id, cfg.codec_bos_id]
        codec = talker.get_input_embeddings()(torch.tensor(control, device=self.device))
        codec_side = torch.cat([torch.zeros(3, codec.shape[1], dtype=codec.dtype, device=self.device), codec])
        return torch.cat([user, text_side + codec_side])

    def _forward_prefill(self, rows: list[tuple[int, TalkerPrefix, torch.Tensor, int]]) -> torch.Tensor:
        inputs = [self._prefill_embeds(prefix, first, speaker) for _, prefix, first, speaker in rows]
        lengths = [x.shape[0] for x in inputs]
        width = max(lengths)
        padded = torch.stack([torch.nn.functional.pad(x, (0, 0, 0, width - x.shape[0])) for x in inputs])
        batch = SlotBatch.of([slot for slot, *_ in rows], [0] * len(rows), lengths)
        hidden = self._forward(padded, batch)
        return hidden[torch.arange(len(rows)), torch.tensor(lengths) - 1]

    # -- compute helpers ----------------------------------------------------------------------
    def _project_text(self, x: torch.Tensor) -> torch.Tensor:
        return self.talker.text_projection(x.to(self.device, self.dtype))

    def _forward(self, embeds: torch.Tensor, batch: SlotBatch) -> torch.Tensor:
        mask = self.kv.bind(batch)["full_attention"]
        positions = batch.position_ids().to(self.device)
        out = self.talker.model(inputs_embeds=embeds, attention_mask=mask, position_ids=positions, use_cache=True,
                                **cache_kwargs(self.talker.model, self.kv))
        return out.last_hidden_state

    def _forward_decode(self, rows: list[tuple[int, int, torch.Tensor]]) -> torch.Tensor:
        slots = torch.tensor([slot for slot, _, _ in rows], device=self.device)
        text = self._project_text(torch.stack([t for _, _, t in rows]))
        embeds = (self.feedback[slots] + text)[:, None, :]
        batch = SlotBatch.of([s for s, _, _ in rows], [p for _, p, _ in rows], [1] * len(rows))
        return self._forward(embeds, batch)[:, -1]

    def _pick_code0(self, logits: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        seen = self.seen[slots]
        penalized = torch.where(logits > 0, logits / self.repetition_penalty, logits * self.repetition_penalty)
        logits = torch.where(seen, penalized, logits).masked_fill(self.suppress, float("-inf"))
        code0 = logits.argmax(-1)
        # A device tensor, not a Python True: nothing here may copy from the host (CUDA graphs).
        self.seen.index_put_((slots, code0), self._true)
        return code0

    def _code_predictor(self, last_hidden: torch.Tensor, code0: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        predictor = self.talker.code_predictor
        embed0 = self.talker.get_input_embeddings()(code0)
        cache = DynamicCache(config=predictor.config)
        inputs = torch.stack([last_hidden, embed0], dim=1)
        feedback = embed0.clone()
        codes = []
        for group in range(self.num_groups - 1):
            out = predictor.model(inputs_embeds=inputs, use_cache=True, **cache_kwargs(predictor.model, cache))
            code = predictor.lm_head[group](out.last_hidden_state[:, -1]).argmax(-1)
            codes.append(code)
            embed = predictor.model.codec_embedding[group](code)
            feedback = feedback + embed
            inputs = embed[:, None, :]
        return torch.stack(codes, dim=1), feedback

    # -- outputs ----------------------------------------------------------------------------------
    def _chunk_output(self, row: _Row, ended: bool) -> RowOutput:
        want = self.first_chunk_frames if row.emitted_frames == 0 else self.chunk_frames
        if not ended and len(row.pending_frames) < want:
            return RowOutput()
        chunk = None
        if row.pending_frames:
            codes = np.stack(row.pending_frames, axis=1).astype(np.int64)  # (groups, n)
            chunk = CodecChunk(codes, start=row.emitted_frames)
            row.emitted_frames += codes.shape[1]
            row.pending_frames = []
        if ended:
            return RowOutput(done=True, final=chunk)
        return RowOutput(emits=[chunk])
