"""Stage builders by name: the explicit map from a config's ``builder`` to the function that
builds the stage's computation. Each family exports its own dict; this merges them."""

from __future__ import annotations

from duplex.models.toy.stages import BUILDERS as TOY

BUILDERS = {
    **TOY,
}
