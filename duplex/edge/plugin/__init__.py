"""The door plug-in seam: a new door is one folder (or one module of your own) plus one entry in
the server's list of doors (``duplex serve --door MODULE:FACTORY``; SIP and Twilio are built in
through the same seam). ``seam.py``: the protocol a door implements and the context its factory
gets; ``load.py``: specs to factories, factories to doors."""

from duplex.edge.plugin.load import DoorError, build_doors, load_factory
from duplex.edge.plugin.seam import RESERVED_NAMES, DoorContext, DoorFactory, DoorPlugin

__all__ = ["RESERVED_NAMES", "DoorContext", "DoorError", "DoorFactory", "DoorPlugin", "build_doors", "load_factory"]
