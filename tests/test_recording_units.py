"""Recording per call, without a server: a recorded phone call says so first, the policy's
switch (required, asked for, paused), and the recordings folder's ids."""

from __future__ import annotations

import pytest
from session_fakes import FakeRuntime

from duplex.config.session import SessionConfig
from duplex.edge.phone.bridge import CallInfo
from duplex.edge.phone.session_agent import SessionCallAgent
from duplex.server.recording import Recorder
from duplex.server.recording_policy import CallRecorder, RecordingDesk, RecordingPolicy
from duplex.session.manager import SessionManager
from duplex.session.observe import CallWatch, Refusal
from duplex.session.playout import OutputFormat
from duplex.session.realtime import events as ev
from duplex.session.recording import Opening, RecordingRefused

FORMAT = OutputFormat(sample_rate=8000, channels=1, frame_ms=20)


class _DeskObserver:
    def __init__(self, desk: RecordingDesk) -> None:
        self.desk = desk

    def open_call(self, session_id: str, door: str, call_id: str, output_format: OutputFormat,
                  opening: Opening) -> CallWatch:
        recorder = self.desk.open_call(call_id, output_format, opening.owner)
        return CallWatch(recorder, recorder)

    def refused(self, door: str, reason: Refusal) -> None:
        pass


def _phone_call(tmp_path, share: float) -> tuple[FakeRuntime, SessionCallAgent]:
    desk = RecordingDesk(Recorder(tmp_path, 2**20, 3600), RecordingPolicy.SHARE, share, "Calls are recorded here.")
    runtime = FakeRuntime()
    sessions = SessionManager(runtime, SessionConfig(), 2, "m", observer=_DeskObserver(desk))  # type: ignore[arg-type]
    return runtime, SessionCallAgent(CallInfo("sip-1@host", "sip", "alice", "agent"), sessions)


async def test_a_recorded_phone_call_says_its_notice_before_anything_else(tmp_path):
    runtime, agent = _phone_call(tmp_path, share=1.0)
    assert len(runtime.turns) == 1  # a response of its own, at open, before the caller said anything
    assert "Calls are recorded here." in runtime.last.request.instructions
    assert (tmp_path / "sip-1_host.json").exists()
    await agent.close()


async def test_an_unrecorded_phone_call_says_nothing_first(tmp_path):
    runtime, agent = _phone_call(tmp_path, share=0.0)
    assert runtime.turns == [] and not list(tmp_path.iterdir())
    await agent.close()


def test_a_recording_asked_for_can_pause_and_one_required_cannot(tmp_path):
    recorder = Recorder(tmp_path, 2**20, 3600)
    asked = CallRecorder(recorder, "c1", FORMAT, "owner", RecordingPolicy.ON_REQUEST, False, "n")
    assert not asked.active and not list(tmp_path.iterdir())  # nothing made before it is asked for
    asked.ask(True)
    asked.event(ev.InputCleared(), None)
    asked.ask(False)
    asked.event(ev.InputCleared(), None)  # paused: not written
    asked.close()
    assert (tmp_path / "c1.jsonl").read_text().count("input_audio_buffer.cleared") == 1
    required = CallRecorder(recorder, "c2", FORMAT, None, RecordingPolicy.ALL, True, "n")
    with pytest.raises(RecordingRefused) as refused:
        required.ask(False)
    assert refused.value.code == "recording_required" and required.active
    required.close()


def test_the_folder_refuses_an_id_that_leaves_it(tmp_path):
    store = Recorder(tmp_path / "calls", 2**20, 3600).store
    for bad in ("../x", ".hidden", "a/b"):
        with pytest.raises(ValueError):
            store.wav(bad)
    assert store.find("missing") is None
