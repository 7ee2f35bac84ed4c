"""Stage builders of the qwen3_omni family: audio encoder -> thinker -> talker -> code2wav.

Each builder loads its part of the checkpoint in ``args.model_dir`` (offline) and returns the
computation its configured scheduler drives: ``simple`` batch functions for the encoder and
code2wav, ``StepRunner``s for the thinker (``ar``) and the talker (``feedback_ar``). KV slots are
sized from the stage's memory budget.
"""

from __future__ import annotations

from pathlib import Path

from duplex.models.qwen3_omni import payloads  # noqa: F401 (defines the family's payloads in this process)
from duplex.runtime.contract import BuildContext

DEFAULT_MODEL_DIR = "~/.cache/duplex/omni-tiny"


def model_dir(ctx: BuildContext) -> str:
    path = Path(str(ctx.args.get("model_dir", DEFAULT_MODEL_DIR))).expanduser()
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"stage {ctx.stage}: no checkpoint in {path} "
                                f"(make a tiny one with `duplex model init-tiny {path}`)")
    if path == Path(DEFAULT_MODEL_DIR).expanduser():
        from duplex.models.qwen3_omni.tiny import refresh_if_stale

        refresh_if_stale(path)  # the shared cache may hold a tiny checkpoint an older version wrote
    return str(path)


def build_encoder(ctx: BuildContext):
    from duplex.models.qwen3_omni.encoder import StreamingAudioEncoder
    from duplex.models.qwen3_omni.loading import load_audio_encoder

    tower, _ = load_audio_encoder(model_dir(ctx), ctx.device)
    return StreamingAudioEncoder(tower, ctx.device)


def build_thinker(ctx: BuildContext):
    from duplex.models.qwen3_omni.loading import load_thinker, special_tokens
    from duplex.models.qwen3_omni.thinker import ThinkerRunner

    lm, config = load_thinker(model_dir(ctx), ctx.device)
    return ThinkerRunner(lm, config, special_tokens(config), memory_bytes=ctx.memory_bytes,
                         max_len=int(ctx.args.get("max_len", 1024)),
                         max_slots=ctx.max_running_requests,
                         system_ids=[int(i) for i in ctx.args.get("system_ids", [])], device=ctx.device)


def build_talker(ctx: BuildContext):
    from duplex.models.qwen3_omni.loading import load_talker
    from duplex.models.qwen3_omni.talker import TalkerRunner

    talker, config = load_talker(model_dir(ctx), ctx.device)
    return TalkerRunner(talker, config, memory_bytes=ctx.memory_bytes, max_len=int(ctx.args.get("max_len", 2048)),
                        max_slots=ctx.max_running_requests,
                        first_chunk_frames=int(ctx.args.get("first_chunk_frames", 2)),
                        chunk_frames=int(ctx.args.get("chunk_frames", 6)),
                        speaker=str(ctx.args.get("speaker", "ethan")), device=ctx.device)


def build_code2wav(ctx: BuildContext):
    from duplex.models.qwen3_omni.code2wav import StreamingCode2Wav
    from duplex.models.qwen3_omni.loading import load_code2wav

    code2wav, _ = load_code2wav(model_dir(ctx), ctx.device)
    context = ctx.args.get("left_context_frames")
    return StreamingCode2Wav(code2wav, left_context_frames=None if context is None else int(context), device=ctx.device)


BUILDERS = {
    "qwen3_omni.encoder": build_encoder,
    "qwen3_omni.thinker": build_thinker,
    "qwen3_omni.talker": build_talker,
    "qwen3_omni.code2wav": build_code2wav,
}
