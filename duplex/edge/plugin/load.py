"""Turning ``--door MODULE:FACTORY`` into a factory, and factories into doors, with an error that
names what was wrong: the server checks every spec before it starts the stages, and builds the
doors before anything listens."""

from __future__ import annotations

import importlib
from collections.abc import Sequence

from duplex.edge.plugin.seam import RESERVED_NAMES, DoorContext, DoorFactory, DoorPlugin


class DoorError(ValueError):
    """A door that cannot be served: a bad ``--door`` spec, a factory that failed, a name taken."""


def load_factory(spec: str) -> DoorFactory:
    """``MODULE:FACTORY`` -> the factory; raises DoorError naming what was wrong (the server
    checks every spec before it starts anything)."""
    module_name, colon, attribute = spec.partition(":")
    if not colon or not module_name or not attribute:
        raise DoorError(f"--door {spec!r}: expected MODULE:FACTORY, e.g. mypackage.doors:make_door")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise DoorError(f"--door {spec!r}: no module named {exc.name!r} (is it on the Python path?)") from None
        raise DoorError(f"--door {spec!r}: module {module_name!r} failed to import: {exc}") from exc
    except Exception as exc:  # its own code failed on import: name the module and the error
        raise DoorError(f"--door {spec!r}: module {module_name!r} failed to import: "
                        f"{type(exc).__name__}: {exc}") from exc
    factory = getattr(module, attribute, None)
    if factory is None:
        raise DoorError(f"--door {spec!r}: module {module_name!r} has no attribute {attribute!r}")
    if not callable(factory):
        raise DoorError(f"--door {spec!r}: {attribute!r} is a {type(factory).__name__}, not a factory "
                        "(a callable taking a DoorContext)")
    return factory


def build_doors(factories: Sequence[DoorFactory], context: DoorContext) -> list[DoorPlugin]:
    """Each factory's door, in order; raises DoorError if one fails or two share a name."""
    doors: list[DoorPlugin] = []
    taken = set(RESERVED_NAMES)
    for factory in factories:
        label = getattr(factory, "__qualname__", repr(factory))
        try:
            door = factory(context)
        except Exception as exc:  # a plug-in's own code: say whose and stop before serving
            raise DoorError(f"door factory {label}: {type(exc).__name__}: {exc}") from exc
        if door.name in taken:
            raise DoorError(f"door factory {label}: the name {door.name!r} is taken "
                            f"(taken: {', '.join(sorted(taken))})")
        taken.add(door.name)
        doors.append(door)
    return doors
