"""Supervision and admission settings, and the turn-wait estimate, without processes."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from duplex.config import load_pipeline
from duplex.runtime.load import LoadSnapshot, StageLoad


def test_supervision_and_admission_settings_come_from_the_command_line_and_are_checked():
    pipeline = load_pipeline("toy", ["--supervision.max_restarts", "3", "--supervision.restart_window_s", "10",
                                     "--supervision.watchdog_timeout_s", "0", "--admission.turn_budget_ms", "800"])
    assert (pipeline.supervision.max_restarts, pipeline.supervision.restart_window_s) == (3, 10.0)
    assert pipeline.supervision.watchdog_timeout_s == 0 and pipeline.admission.turn_budget_ms == 800
    assert pipeline.supervision.request_stall_s == 30 and pipeline.admission.enabled
    with pytest.raises((ValidationError, ValueError), match="restart_window_s"):
        load_pipeline("toy", ["--supervision.restart_window_s", "0"])
    with pytest.raises((ValidationError, ValueError), match="max_loop_lag"):
        load_pipeline("toy", ["--admission.max_loop_lag_ms", "-1"])


def test_a_new_turn_waits_a_step_per_batch_queued_ahead_at_every_stage_and_not_for_its_own():
    asr = StageLoad(queued=8, live_requests=9, step_s=0.5, batch=4)  # two batches ahead
    tts = StageLoad(queued=0, live_requests=1, step_s=4.0, batch=1)  # slow but idle: nothing ahead
    assert asr.wait_s == pytest.approx(1.0) and tts.wait_s == 0
    snapshot = LoadSnapshot(loop_lag_s=0.2, stages={"asr": asr, "tts": tts})
    assert snapshot.turn_wait_s == pytest.approx(1.2)
    assert LoadSnapshot().turn_wait_s == 0  # nothing sampled yet: nothing to refuse for
