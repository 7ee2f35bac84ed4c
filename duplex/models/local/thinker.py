"""The Gemma thinker as an ``ar`` stage runner (``StepRunner``): one request = one agent turn.

Input: the ASR stage's ``Transcript``s (or a client's ``Transcript(final=True)``). Interim
transcripts (``final=False``) arriving while the user speaks are prefilled ahead (K/V only,
nothing is said), so the end of the turn computes only the tokens the final transcript changed.
The prompt is the persona (its KV computed once and copied into the slot), the session's history
within ``history_budget`` tokens, and the new user line. The turn ends at the first line break
(the few-shot examples teach one line per turn), an end token, or ``max_new_tokens`` (stop
tokens and line breaks do not end it before ``min_new_tokens``).
Output: ``AgentText`` deltas as tokens resolve; the eos emit carries no data. Finished turns join
the session's history; an aborted turn is set aside (the caller heard an unknown part of it)
until a later request of the session says what was heard.

History edits ride on the request (the session sets them):
  ``TurnRequest.heard``: that turn's reply was heard up to ``audio_end_ms``; the history keeps
      only that part (``contract.heard_cut``: the words played, else an estimate), an aborted
      turn joins the history so cut, and
      cached K/V past the cut is freed;
  ``TurnRequest.supersedes``: speculative turns whose user line this request repeats in full:
      they leave the history;
  ``SessionEnd``: the session hung up; its history and cached K/V are freed (the request carries
      no user text and finishes without compute).
Per-request sampling knobs ride in ``TurnRequest.options`` (``temperature``, ``top_k``).

Threads: ``open/feed/ready/plan/resolve/close`` run on the scheduler thread, ``compute`` on its
worker. ``plan`` fixes each row's positions without reading earlier results (lookahead), and
``compute`` reads the previous step's sampled token from ``_last_token``, written by the previous
``compute`` on the same worker thread.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, cast

import torch

from duplex.models.local.conversation_cache import CachedConversation, ConversationCache
from duplex.models.local.gemma import GemmaModel
from duplex.models.local.prompt import Persona, SessionHistory, select_recent
from duplex.runtime.contract import (
    AgentText,
    KVPrefix,
    RecentSessions,
    Request,
    RowOutput,
    SessionEnd,
    Transcript,
    TurnRequest,
    heard_cut,
)


@dataclass
class ThinkerSettings:
    max_new_tokens: int = 48
    min_new_tokens: int = 0  # stop tokens and line breaks do not end a reply before this many (tests)
    # a decode step takes at least this long (tests: a reply is written at a known pace on any
    # CPU, so "the caller talks while the thinker still writes" does not depend on the machine)
    min_step_ms: float = 0.0
    history_budget: int = 640  # tokens of persona + history + user line
    temperature: float = 0.0  # 0: greedy
    top_k: int = 40
    cached_sessions: int = 8  # conversations whose KV is kept between turns
    speech_chars_per_s: float = 15.0  # the TTS voice's speaking rate (Piper joe, measured ~15)
    # Prefill tokens one step computes (at least one row's): when many turns end at once, the
    # first rows start decoding (and speaking) while later ones wait a step, instead of every
    # row waiting for all prefills. Finals go before the interim (warm) prefills.
    prefill_tokens_per_step: int = 256


@dataclass
class _Row:
    request_id: str
    session_id: str
    request: Request
    user_text: str | None = None
    prompt: list[int] = field(default_factory=list)  # tokens after the shared prefix
    planned_tokens: int = 0  # tokens whose computation has been planned
    generated: list[int] = field(default_factory=list)  # resolved tokens
    text: str = ""  # resolved reply text (up to the stop)
    finished: bool = False
    interim: list[int] | None = None  # an interim transcript's prompt, waiting to be prefilled
    resident: list[int] = field(default_factory=list)  # tokens whose K/V the slot holds from 0 on


@dataclass(frozen=True)
class _Prefill:
    slot: int
    reused: KVPrefix  # K/V copied into the slot first: positions [0, start)
    start: int
    tokens: list[int]  # computed from ``start``
    request: Request
    resident_before: list[int] = field(default_factory=list)  # the row's slot tokens before this job


class _PrefillBudget:
    """Prefill tokens left in one step; the first job always fits (no row waits forever)."""

    def __init__(self, tokens: int) -> None:
        self.left = tokens
        self.jobs = 0

    def take(self, job: _Prefill, row: _Row) -> _Prefill | None:
        if self.jobs and job.tokens and len(job.tokens) > self.left:
            row.resident = job.resident_before  # not computed: the slot holds what it held
            return None
        self.left -= len(job.tokens)
        self.jobs += 1
        return job


@dataclass(frozen=True)
class _Plan:
    prefill: list[_Prefill]
    decode: list[tuple[int, int, Request]]  # (slot, position of the token fed, its request)
    empty: list[int]  # rows with nothing to say (empty user text): done without compute
    warm: list[_Prefill] = field(default_factory=list)  # interim transcripts: K/V only, no token


class GemmaThinker:
    """``StepRunner`` for the ``ar`` scheduler."""

    def __init__(self, model: GemmaModel, persona: Persona, settings: ThinkerSettings, capacity: int) -> None:
        self.model, self.persona, self.settings = model, persona, settings
        self.capacity = capacity
        self.histories: RecentSessions[SessionHistory] = RecentSessions(SessionHistory, max_sessions=256)
        self._prefix_ids = [model.bos_id] + model.encode(persona.preamble())
        self._prefix: KVPrefix = model.compute_prefix(self._prefix_ids)
        self.conversations = ConversationCache(settings.cached_sessions)
        self._rows: dict[int, _Row] = {}
        self._last_token: dict[int, int] = {}  # worker thread only
        self._warm_token: dict[int, int] = {}  # worker thread only: token after a slot's last interim
        self.prefilled_tokens = 0  # tokens prefilled to answer, all requests (benchmarks read it)
        self.warmed_tokens = 0  # tokens prefilled ahead from interim transcripts
        self._stop_ids = set(model.stop_ids)

    # -- scheduler thread ----------------------------------------------------------------------
    def open(self, slot: int, request_id: str, request: Request) -> None:
        session_id = request.session_id or request_id
        self._rows[slot] = _Row(request_id, session_id, request)
        if isinstance(request, SessionEnd):
            self.forget_session(session_id)
        else:
            self.edit_history(session_id, cast(TurnRequest, request))  # a probe never reaches the thinker

    def forget_session(self, session_id: str) -> None:
        self.histories.forget(session_id)
        self.conversations.forget(session_id)

    def edit_history(self, session_id: str, request: TurnRequest) -> None:
        """Apply a request's ``heard`` / ``supersedes`` to its session's history."""
        if not self.histories.has(session_id):
            return
        history = self.histories.get(session_id)
        changed = False
        for superseded in request.supersedes:
            changed |= history.drop(superseded)
        cut = request.heard
        if cut is not None and cut.request_id:
            heard = heard_cut(cut.text, cut.audio_end_ms, cut.audio_ms, self.settings.speech_chars_per_s)
            changed |= history.truncate(cut.request_id, heard)
        if changed:
            kept = [token for u, a in history.turns for token in self.model.encode(self.persona.turn_text(u, a))]
            self.conversations.trim(session_id, self._prefix_ids + kept)

    def feed(self, slot: int, source: str, data: Any, eos: bool) -> None:
        row = self._rows[slot]
        if isinstance(row.request, SessionEnd):
            row.user_text = ""  # nothing to answer (and no history to open again)
            return
        if isinstance(row.request, TurnRequest) and (row.request.tools or row.request.tool_outputs):
            raise ValueError("tools: the local thinker (Gemma 3 270M, a base model) cannot call functions; serve "
                             "an engine thinker for session tools (duplex serve --llm URL --llm-model NAME)")
        if data is not None and not isinstance(data, Transcript):
            raise ValueError(f"expected a Transcript, got {type(data).__name__}")
        text = data.text if data is not None else None
        final = eos or (data is not None and data.final)
        if text is not None and not final and row.user_text is None:
            self._take_interim(row, text.strip())
        if text is not None and final and row.user_text is None:
            prompt = self.prompt_tokens(row.session_id, text.strip())
            room = self.model.cache.max_len - len(self._prefix_ids) - 1
            if len(prompt) > room:
                raise ValueError(f"the user turn is {len(prompt)} tokens; at most {room} fit the context")
            row.user_text, row.prompt = text.strip(), prompt
        if eos and row.user_text is None:
            raise ValueError("the turn ended without any user text")

    def _take_interim(self, row: _Row, text: str) -> None:
        """The user is still speaking: their words so far can be prefilled now, so that at the end
        of the turn only what changed is left to compute (the final transcript usually extends
        the interim one by a word or two)."""
        if not text:
            return
        prompt = self.prompt_tokens(row.session_id, text)
        fits = len(self._prefix_ids) + len(prompt) < self.model.cache.max_len
        if fits and self._prefix_ids + prompt != row.resident:
            row.interim = prompt

    def ready(self, slot: int) -> bool:
        row = self._rows.get(slot)
        if row is None or row.finished:
            return False
        if row.user_text is None:
            return row.interim is not None
        return row.planned_tokens < self._token_limit(row)

    def plan(self, slots: list[int]) -> _Plan:
        prefill, decode, empty, warm, speaking = [], [], [], [], []
        budget = _PrefillBudget(self.settings.prefill_tokens_per_step)
        for slot in slots:
            row = self._rows[slot]
            if row.user_text is None:  # still speaking: its interim transcript may be prefilled
                speaking.append(slot)
            elif not row.user_text:
                empty.append(slot)
                row.planned_tokens = self._token_limit(row)
            elif row.planned_tokens == 0:
                job = budget.take(self._plan_prefill(slot, row, row.prompt), row)
                if job is not None:  # else it waits for the next step
                    prefill.append(job)
                    row.planned_tokens = 1
            else:
                decode.append((slot, len(self._prefix_ids) + len(row.prompt) + row.planned_tokens - 1, row.request))
                row.planned_tokens += 1
        for slot in speaking:
            row = self._rows[slot]
            job = budget.take(self._plan_prefill(slot, row, row.interim or []), row)
            if job is not None:
                warm.append(job)
                row.interim = None
        return _Plan(prefill, decode, empty, warm)

    def _plan_prefill(self, slot: int, row: _Row, prompt: list[int]) -> _Prefill:
        """Start from the longest K/V already known for these tokens: what the slot holds from an
        interim prefill, the session's cached conversation, or the persona's."""
        tokens = self._prefix_ids + prompt
        if tokens == row.resident:  # an interim prefill computed exactly these: its token stands
            return _Prefill(slot, [], len(tokens), [], row.request, row.resident)
        reused, start = self._prefix, len(self._prefix_ids)
        cached = self.conversations.get(row.session_id)
        if cached is not None:
            matching = min(cached.reusable(tokens), len(tokens) - 1)  # one token left to get logits
            if matching > start:
                reused = [(k[:, :matching], v[:, :matching]) for k, v in cached.kv]
                start = matching
        in_slot = min(_common_prefix(row.resident, tokens), len(tokens) - 1)
        if in_slot >= start:
            reused, start = [], in_slot  # already in the slot: nothing to copy
        job = _Prefill(slot, reused, start, tokens[start:], row.request, row.resident)
        row.resident = tokens
        return job

    def resolve(self, plan: _Plan, raw: dict[int, int]) -> dict[int, RowOutput]:
        outputs = {slot: RowOutput(done=True) for slot in plan.empty}
        for slot, token in raw.items():
            row = self._rows.get(slot)
            if row is None or row.finished:
                continue
            outputs[slot] = self._advance(row, token)
        return outputs

    def close(self, slot: int) -> None:
        row = self._rows.pop(slot, None)
        if row is None or not row.user_text:
            return
        if not row.finished:  # aborted: what the caller heard of it comes with a later request
            self.histories.get(row.session_id).interrupted = (row.request_id, row.user_text, row.text)
            return
        # Positions computed in this slot: every prompt token and every generated token but the
        # last (it was sampled, never fed back).
        computed = self._prefix_ids + row.prompt + row.generated[:-1]
        kv = self.model.cache.read_prefix(slot, len(computed))
        self.conversations.put(row.session_id, CachedConversation(tuple(computed), kv))
        self.histories.get(row.session_id).add(row.user_text, row.text, row.request_id)

    def held(self) -> dict[str, int]:
        return {"open_rows": len(self._rows)}

    # -- worker thread -------------------------------------------------------------------------
    def compute(self, plan: _Plan) -> dict[int, int]:
        began = time.monotonic()
        sampled = self._compute(plan)
        if plan.decode and self.settings.min_step_ms > 0:
            time.sleep(max(0.0, began + self.settings.min_step_ms / 1000 - time.monotonic()))
        return sampled

    def _compute(self, plan: _Plan) -> dict[int, int]:
        sampled: dict[int, int] = {}
        for job in plan.warm:
            self.model.cache.copy_prefix(job.slot, job.reused)
            logits = self.model.prefill(job.slot, job.start, job.tokens)
            self.warmed_tokens += len(job.tokens)
            self._warm_token[job.slot] = self._sample(logits[None], [job.request])[0]
        for job in plan.prefill:
            if not job.tokens:  # the final transcript is the interim one: take that step's token
                sampled[job.slot] = self._warm_token.pop(job.slot)
                continue
            self.model.cache.copy_prefix(job.slot, job.reused)
            logits = self.model.prefill(job.slot, job.start, job.tokens)
            self.prefilled_tokens += len(job.tokens)
            sampled[job.slot] = self._sample(logits[None], [job.request])[0]
        if plan.decode:
            slots = [slot for slot, _, _ in plan.decode]
            positions = [pos for _, pos, _ in plan.decode]
            logits = self.model.decode(slots, positions, [self._last_token[s] for s in slots])
            for slot, token in zip(slots, self._sample(logits, [request for _, _, request in plan.decode])):
                sampled[slot] = token
        self._last_token.update(sampled)
        return sampled

    # -- helpers -------------------------------------------------------------------------------
    def _sample(self, logits: torch.Tensor, requests: list[Request]) -> list[int]:
        tokens = []
        for row_logits, request in zip(logits, requests):
            options = request.options if isinstance(request, TurnRequest) else {}
            temperature = float(options.get("temperature", self.settings.temperature))
            if temperature <= 0:
                tokens.append(int(row_logits.argmax()))
                continue
            top = torch.topk(row_logits / temperature, int(options.get("top_k", self.settings.top_k)))
            choice = torch.multinomial(torch.softmax(top.values, dim=-1), 1)
            tokens.append(int(top.indices[choice]))
        return tokens

    def _token_limit(self, row: _Row) -> int:
        room = self.model.cache.max_len - len(self._prefix_ids) - len(row.prompt)
        wanted = getattr(row.request, "max_new_tokens", None) or self.settings.max_new_tokens
        return max(1, min(wanted, room))

    def prompt_tokens(self, session_id: str, user_text: str) -> list[int]:
        """Token ids after the shared prefix: the newest history turns that fit, then the user line.

        Each turn is tokenized on its own, so a session's earlier turns keep the same ids from
        one prompt to the next (the prefix a conversation cache can reuse)."""
        current = self.model.encode(self.persona.turn_text(user_text, None))
        room = min(self.settings.history_budget, self.model.cache.max_len - self.settings.max_new_tokens)
        room -= len(self._prefix_ids) + len(current)
        turns = [self.model.encode(self.persona.turn_text(u, a)) for u, a in self.histories.get(session_id).turns]
        kept = select_recent(turns, room)
        return [token for turn in kept for token in turn] + current

    def _advance(self, row: _Row, token: int) -> RowOutput:
        row.generated.append(token)
        may_stop = len(row.generated) >= self.settings.min_new_tokens
        line, newline = "", False
        if token not in self._stop_ids or not may_stop:
            decoded = cast(str, self.model.tokenizer.decode(row.generated, skip_special_tokens=True))
            if may_stop:
                line, separator, _ = decoded.partition("\n")
            else:  # too short to stop: a line break is just a space
                line, separator = decoded.replace("\n", " "), ""
            newline = bool(separator)
            line = line.lstrip() if newline else line.lstrip().rstrip("\ufffd")  # wait for a split character
        emits = []
        if line.startswith(row.text) and len(line) > len(row.text):
            emits.append(AgentText(line[len(row.text):]))
            row.text = line
        stop = (may_stop and (token in self._stop_ids or newline)) or len(row.generated) >= self._token_limit(row)
        if stop:
            row.finished = True
            return RowOutput(emits=emits, done=True)
        return RowOutput(emits=emits)


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
