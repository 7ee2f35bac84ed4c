"""Screening a placed call for an answering machine (``amd``), between the leg and the
conversation: from the answer on, the callee's audio goes to the detector and the conversation
hears silence instead (so it does not answer a greeting); then

- a person: the conversation hears the callee from now on and the agent says its first message;
- a machine, policy ``hang_up``: the call is ended;
- a machine, policy ``leave_message``: once the beep has ended (or ``NO_BEEP_WAIT_MS`` after the
  verdict, for a machine without one) the agent says its first message as the message, and the
  call ends when that reply has played.
"""

from __future__ import annotations

import enum

import numpy as np

from duplex.edge.phone.amd import AmdDecision, AmdPolicy, AmdSettings, AmdVerdict, AnsweringMachineDetector

NO_BEEP_WAIT_MS = 10_000


class ScreenStep(enum.Enum):
    SPEAK = "speak"  # a person: the conversation starts
    WAIT_FOR_BEEP = "wait_for_beep"  # a machine, and a message to leave: once its beep is over
    LEAVE_MESSAGE = "leave_message"  # the beep is over: say the message, then end
    HANG_UP = "hang_up"


class MachineScreen:
    def __init__(self, policy: AmdPolicy, sample_rate: int, settings: AmdSettings | None = None) -> None:
        self.policy = policy
        self.detector = AnsweringMachineDetector(sample_rate, settings)
        self.decision: AmdDecision | None = None
        self.withholding = True  # the conversation hears silence, not the callee
        self.decision_told = False  # the verdict has been reported (by the agent)
        self._done = False

    def hear(self, pcm: np.ndarray) -> ScreenStep | None:
        """The callee's audio (int16); what to do now, once (None: nothing yet)."""
        if self._done:
            return None
        made = self.detector.feed(pcm)
        if made is not None:
            self.decision = made
            if made.verdict is AmdVerdict.HUMAN:
                self._done, self.withholding = True, False
                return ScreenStep.SPEAK
            if self.policy is AmdPolicy.HANG_UP:
                self._done = True
                return ScreenStep.HANG_UP
            if not self._message_time(made):
                return ScreenStep.WAIT_FOR_BEEP
        decision = self.decision
        if decision is None or not self._message_time(decision):
            return None
        self._done = True
        return ScreenStep.LEAVE_MESSAGE

    def _message_time(self, decision: AmdDecision) -> bool:
        return (self.detector.beep_end_ms is not None
                or self.detector.now_ms - decision.decided_ms >= NO_BEEP_WAIT_MS)
