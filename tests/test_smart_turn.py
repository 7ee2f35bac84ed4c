"""The Smart Turn v3.2 model (pipecat's ONNX file, shipped inside duplex, run by onnxruntime), on speech
made at test time with Piper without its noise (the same samples on every run): a finished
sentence is complete, one that trails off in a filler is not; the server's lazy holder loads it
on first use, off the event loop, and answers on the model's worker thread."""

from __future__ import annotations

import asyncio
import threading

import numpy as np

from duplex.models.smart_turn import SmartTurn
from duplex.server.turn_end import LazyTurnEnd, load_turn_end_model
from tests.local_helpers import silence, speak

CHECK_S = 0.2  # the pause at which a semantic turn is judged: the model hears it too


def _turn(text: str) -> np.ndarray:
    return np.concatenate([silence(0.3), speak(text), silence(CHECK_S)])


def test_a_finished_sentence_is_complete_and_one_trailing_off_in_a_filler_is_not():
    model = SmartTurn()
    try:
        # measured: 0.98 and 0.01 (pytest -s prints them); the margins are wide on either side of 0.5
        finished = model.predict(_turn("I would like a bubble tea with less ice."))
        trailing = model.predict(_turn("I would like a large, um,"))
        print(f"\nP(complete): finished {finished:.3f}, trailing off {trailing:.3f}")
        assert finished > 0.8 and trailing < 0.2
        # a turn longer than the model's 8 s window: only its end counts
        long = np.concatenate([speak("Let me think about what I want to drink today, there is so much. "),
                               _turn("I would like a large, um,")])
        assert model.predict(long) < 0.2
    finally:
        model.close()


async def test_the_server_loads_it_when_wanted_and_it_answers_off_the_event_loop():
    held = load_turn_end_model(eager=False)
    assert isinstance(held, LazyTurnEnd)
    loop_thread = threading.get_ident()
    answered_on: list[int] = []
    try:
        first, second = await asyncio.gather(held.complete_probability(_turn("Tell me a joke.")),
                                             held.complete_probability(_turn("Can I get the, um,")))
        model = await held.model()
        original = model.predict

        def spy(audio: np.ndarray) -> float:
            answered_on.append(threading.get_ident())
            return original(audio)

        model.predict = spy  # type: ignore[method-assign]
        await held.complete_probability(_turn("Tell me a joke."))
    finally:
        held.close()
    assert first > 0.8 and second < 0.2
    assert answered_on and loop_thread not in answered_on
