"""Stage builders of the qwen3_omni family: audio encoder -> thinker -> talker -> code2wav.

Each builder makes its part of the model (from the checkpoint in ``args.model_dir``, offline, or
at real shapes with random weights, ``args.shapes``: see parts) on the stage's device and returns
the computation its configured scheduler drives: ``simple`` batch functions for the encoder and
code2wav, ``StepRunner``s for the thinker (``ar``) and the talker (``feedback_ar``). KV slots are
sized from the stage's memory budget.
"""

from __future__ import annotations

from duplex.models.qwen3_omni import payloads  # noqa: F401 (defines the family's payloads in this process)
from duplex.runtime.contract import BuildContext


def build_encoder(ctx: BuildContext):
    from duplex.models.qwen3_omni.encoder import StreamingAudioEncoder
    from duplex.models.qwen3_omni.parts import load

    tower, _ = load("encoder", ctx.args, ctx.device, ctx.stage)
    return StreamingAudioEncoder(tower, ctx.device)


def build_thinker(ctx: BuildContext):
    from duplex.models.qwen3_omni.loading import special_tokens
    from duplex.models.qwen3_omni.parts import load
    from duplex.models.qwen3_omni.thinker import ThinkerRunner

    lm, config = load("thinker", ctx.args, ctx.device, ctx.stage)
    return ThinkerRunner(lm, config, special_tokens(config), memory_bytes=ctx.memory_bytes,
                         max_len=int(ctx.args.get("max_len", 1024)),
                         max_slots=ctx.max_running_requests,
                         system_ids=[int(i) for i in ctx.args.get("system_ids", [])], device=ctx.device,
                         ignore_eos=bool(ctx.args.get("ignore_eos", False)), graphs=ctx.args.get("graphs"))


def build_talker(ctx: BuildContext):
    from duplex.models.qwen3_omni.parts import load
    from duplex.models.qwen3_omni.talker import TalkerRunner

    talker, config = load("talker", ctx.args, ctx.device, ctx.stage)
    return TalkerRunner(talker, config, memory_bytes=ctx.memory_bytes, max_len=int(ctx.args.get("max_len", 2048)),
                        max_slots=ctx.max_running_requests,
                        first_chunk_frames=int(ctx.args.get("first_chunk_frames", 2)),
                        chunk_frames=int(ctx.args.get("chunk_frames", 6)),
                        speaker=str(ctx.args.get("speaker", "ethan")), device=ctx.device,
                        graphs=ctx.args.get("graphs"), ignore_eos=bool(ctx.args.get("ignore_eos", False)))


def build_code2wav(ctx: BuildContext):
    from duplex.models.qwen3_omni.code2wav import StreamingCode2Wav
    from duplex.models.qwen3_omni.parts import load

    code2wav, _ = load("code2wav", ctx.args, ctx.device, ctx.stage)
    context = ctx.args.get("left_context_frames")
    return StreamingCode2Wav(code2wav, left_context_frames=None if context is None else int(context), device=ctx.device)


BUILDERS = {
    "qwen3_omni.encoder": build_encoder,
    "qwen3_omni.thinker": build_thinker,
    "qwen3_omni.talker": build_talker,
    "qwen3_omni.code2wav": build_code2wav,
}
