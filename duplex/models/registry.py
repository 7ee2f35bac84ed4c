"""Stage builders by name: the explicit map from a config's ``builder`` to the function that
builds the stage's computation. Each family exports its own dict; this merges them."""

from __future__ import annotations

from duplex.models.engine.stages import BUILDERS as ENGINE
from duplex.models.local.stages import BUILDERS as LOCAL
from duplex.models.qwen3_omni.stages import BUILDERS as QWEN3_OMNI
from duplex.models.speech.stages import BUILDERS as SPEECH
from duplex.models.toy.stages import BUILDERS as TOY
from duplex.models.toy_voice.stages import BUILDERS as TOY_VOICE

BUILDERS = {
    **ENGINE,
    **LOCAL,
    **QWEN3_OMNI,
    **TOY,
    **TOY_VOICE,
    **SPEECH,
}
