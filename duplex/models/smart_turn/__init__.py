"""Smart Turn v3.2 (from pipecat-ai, BSD-2; the model file ships in ``data/``): is the caller's
turn complete, judged from the sound of its last seconds. ``SmartTurn`` answers the session's
``TurnEndModel`` (``duplex.session.endpoint``)."""

from duplex.models.smart_turn.model import SmartTurn, SmartTurnUnavailable, smart_turn_path

__all__ = ["SmartTurn", "SmartTurnUnavailable", "smart_turn_path"]
