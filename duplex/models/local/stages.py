"""Stage builders of the ``local`` family (configs/local.yaml):

    asr     (simple)  user audio chunks -> partial + final transcripts          (terminal)
      | next
    thinker (ar)      transcript -> reply text deltas, Gemma 3 270M              (terminal)
      | stream_to
    tts     (simple)  text deltas -> audio, phrase by phrase, Piper              (terminal)

Builders load weights from the prepared cache (``assets.py``); a missing cache is built on first
use, which takes 1-2 minutes: ``duplex model prepare-local`` does it ahead of time.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from duplex.models.local import assets
from duplex.models.local.asr import LoopGuard, StreamingASR, StreamingPolicy, WhisperTranscriber
from duplex.models.local.prompt import BUBBLE_TEA_ASR_HINT, Persona
from duplex.models.local.tts import OPENERS, PhraseSplitter, PiperSynth
from duplex.runtime.contract import AgentAudio, AgentText, BuildContext, TurnRequest, WorkItem

if TYPE_CHECKING:
    from duplex.models.local.thinker import GemmaThinker

# torch and the Gemma modules load inside build_thinker: the registry imports this module in
# every process that reads it (the CLI, the coordinator), and only the thinker needs them.

# Resident weights: float32 ~1.1 GB; the int8 output layer is a second (int8) copy of the tied
# embedding matrix, so int8 costs a little more memory, not less.
_WEIGHT_BYTES = {"none": 1_100 * 2**20, "int8": 1_300 * 2**20}  # fp32 model (+ int8 output layer)


def _cache_root(ctx: BuildContext) -> Path | None:
    root = ctx.args.get("cache_dir")
    return Path(root).expanduser() if root else None


def _known_args(ctx: BuildContext, allowed: set[str]) -> dict[str, Any]:
    unknown = set(ctx.args) - allowed
    if unknown:
        raise ValueError(f"stage {ctx.stage}: unknown args {sorted(unknown)} (known: {sorted(allowed)})")
    return dict(ctx.args)


def build_asr(ctx: BuildContext) -> StreamingASR:
    policy_fields = set(StreamingPolicy.__dataclass_fields__)
    guard_args = {"loop_guard_below_s": "below_s", "repetition_penalty": "repetition_penalty",
                  "tokens_per_s": "tokens_per_s"}
    args = _known_args(ctx, policy_fields | set(guard_args) | {"cache_dir", "compute_type", "hint"})
    # both checked (pydantic: the error names the arg) before the model loads
    guard = LoopGuard(**{field: args[key] for key, field in guard_args.items() if key in args})
    policy = StreamingPolicy(**{k: v for k, v in args.items() if k in policy_fields})
    model_dir = assets.prepare_whisper(_cache_root(ctx))
    transcriber = WhisperTranscriber(model_dir, threads=ctx.threads, compute_type=args.get("compute_type", "int8"),
                                     hint=str(args.get("hint", BUBBLE_TEA_ASR_HINT)), guard=guard)
    return StreamingASR(transcriber, policy)


def build_thinker(ctx: BuildContext) -> GemmaThinker:
    import torch

    from duplex.models.local.gemma import GemmaModel
    from duplex.models.local.thinker import GemmaThinker, ThinkerSettings

    settings_fields = set(ThinkerSettings.__dataclass_fields__)
    args = _known_args(ctx, settings_fields | {"cache_dir", "quantize", "vocabulary", "layer_weights", "max_len",
                                                 "persona"})
    torch.set_num_threads(ctx.threads)
    model_dir = assets.prepare_gemma(_cache_root(ctx))
    max_len = int(args.get("max_len", 1024))
    quantize = str(args.get("quantize", "int8"))
    vocabulary = str(args.get("vocabulary", "speakable"))
    layer_weights = str(args.get("layer_weights", "fp16"))
    settings = ThinkerSettings(**{k: v for k, v in args.items() if k in settings_fields})
    per_slot = GemmaModel.bytes_per_slot(model_dir, max_len)
    weight_bytes = _WEIGHT_BYTES.get(quantize, _WEIGHT_BYTES["int8"])
    capacity = _slots_for_budget(ctx, per_slot, max_len, weight_bytes, settings.cached_sessions)
    model = GemmaModel(model_dir, num_slots=capacity, max_len=max_len, quantize=quantize,
                       vocabulary=vocabulary, layer_weights=layer_weights)
    persona = Persona(description=args["persona"]) if args.get("persona") else Persona()
    return GemmaThinker(model, persona, settings, capacity)


def _slots_for_budget(ctx: BuildContext, per_slot: int, max_len: int, weight_bytes: int, cached_sessions: int) -> int:
    """KV slots the stage's memory budget pays for after the weights and the conversation cache
    (each cached conversation takes at most one slot's worth), capped by the scheduler."""
    wanted, budget = ctx.max_running_requests, ctx.memory_bytes
    if budget is None:
        return wanted
    fixed = weight_bytes + cached_sessions * per_slot
    affordable = (budget - fixed) // per_slot
    if affordable < 1:
        need = (fixed + per_slot) / 2**20
        raise ValueError(f"stage {ctx.stage}: memory budget {budget / 2**20:.0f} MiB is below the {need:.0f} MiB "
                         f"that the weights, {cached_sessions} cached conversations and one {max_len}-token "
                         f"KV slot need")
    return int(min(wanted, affordable))


class StreamingTTS:
    """The tts stage's computation (``simple`` scheduler): ``AgentText`` deltas in, one
    ``AgentAudio`` per phrase out, carrying the phrase it voices (what the caller heard of a cut
    reply is counted from these)."""

    def __init__(self, synth: PiperSynth, first_clause_words: int = 1, clause_words: int = 4) -> None:
        self.synth = synth
        self.first_clause_words, self.clause_words = first_clause_words, clause_words

    def splitter(self) -> PhraseSplitter:
        return PhraseSplitter(first_clause_words=self.first_clause_words, clause_words=self.clause_words)

    def __call__(self, items: list[WorkItem], states: list[dict]) -> list[list[Any]]:
        return [self._one(item, state) for item, state in zip(items, states)]

    def _one(self, item: WorkItem, state: dict) -> list[Any]:
        if isinstance(item.params, TurnRequest) and not item.params.output_audio:
            return []  # a text-only reply: the thinker's text reaches the client, nothing to voice
        splitter: PhraseSplitter = state.setdefault("splitter", self.splitter())
        phrases = splitter.push(item.data.text) if isinstance(item.data, AgentText) else []
        if item.eos:
            phrases += splitter.flush()
        out = []
        for phrase in phrases:
            audio = self.synth.synthesize(phrase)
            if audio.size:
                spoken = phrase if not state.get("voiced_any") else " " + phrase
                state["voiced_any"] = True
                out.append(AgentAudio(audio, self.synth.sample_rate, spoken))
        return out


def build_tts(ctx: BuildContext) -> StreamingTTS:
    args = _known_args(ctx, {"volume", "length_scale", "first_clause_words", "clause_words"})
    model_path, config_path = assets.piper_voice_paths()
    synth = PiperSynth(model_path, config_path, threads=ctx.threads, volume=float(args.get("volume", 0.8)),
                       length_scale=args.get("length_scale"), ready=OPENERS)
    return StreamingTTS(synth, int(args.get("first_clause_words", 1)), int(args.get("clause_words", 4)))


BUILDERS = {
    "local.asr": build_asr,
    "local.thinker": build_thinker,
    "local.tts": build_tts,
}
