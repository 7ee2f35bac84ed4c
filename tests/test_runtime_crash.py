"""A scheduler whose loop dies takes its stage process down cleanly: the host's I/O loop leaves,
closes its sockets and unlinks its shm segments before the process exits (the coordinator then
fails the stage's requests and restarts it). A real ``StageHost`` served in a thread, with real
sockets and shared memory; the test plays the coordinator and the next stage."""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest
import zmq

from duplex.config import pipeline_from_dict
from duplex.runtime import messages as m
from duplex.runtime import shm
from duplex.runtime.codec import pack
from duplex.runtime.contract import AgentAudio, AgentText, ErrorCode, TurnRequest, WorkItem
from duplex.runtime.relay import RelayWriter
from duplex.runtime.stage_host import HostSpec, StageHost, segment_prefix
from tests.runtime_helpers import toy_pipeline

CRASH = "crash"


class SpeaksUntilCrash:
    """Answers each input with 200 kB of audio (so it rides in shm); its ``batch_key``, which
    the scheduler's own loop calls, raises on a ``CRASH`` input: a bug in the loop, not a failed
    request."""

    def batch_key(self, item: WorkItem) -> None:
        if isinstance(item.data, AgentText) and item.data.text == CRASH:
            raise RuntimeError("batch key bug")

    def __call__(self, items: list[WorkItem], states: list[dict]) -> list[list[AgentAudio]]:
        return [[AgentAudio(np.zeros(50_000, np.float32), 16000)] for _ in items]


def _recv(sock: zmq.Socket, timeout_s: float = 10.0) -> m.Message:
    assert sock.poll(int(timeout_s * 1000)), "no message in time"
    return m.decode(sock.recv())


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the loop's own raise
def test_a_scheduler_crash_closes_sockets_and_unlinks_segments_before_the_host_returns(tmp_path):
    pipeline = pipeline_from_dict(toy_pipeline([
        {"name": "speaker", "builder": "test.speaker", "stream_to": ["listener"]},
        {"name": "listener", "builder": "toy.count", "terminal": True}]))
    addresses = {name: f"ipc://{tmp_path}/{name}" for name in ("speaker", "listener", "coordinator", "control")}
    run_id = f"{os.getpid()}-crash"
    host = StageHost(HostSpec(run_id=run_id, process="speaker", pipeline=pipeline.model_dump(),
                              addresses=addresses), {"test.speaker": lambda ctx: SpeaksUntilCrash()})
    ctx = zmq.Context()
    control, coordinator, listener, to_speaker = (ctx.socket(kind) for kind in (zmq.PUB, zmq.PULL, zmq.PULL, zmq.PUSH))
    for sock, name in ((control, "control"), (coordinator, "coordinator"), (listener, "listener")):
        sock.bind(addresses[name])
    to_speaker.connect(addresses["speaker"])
    inline = RelayWriter(segment_prefix(run_id, "client"), pipeline.relay, use_shm=False)
    served = threading.Thread(target=host.serve)
    served.start()
    try:
        while not coordinator.poll(50):  # a SUB socket hears a broadcast only once subscribed
            control.send(m.encode(m.Hello(epoch=1)))
        assert isinstance(_recv(coordinator), m.Ready)

        def say(request_id: str, text: str) -> None:
            payload = inline.payload_for(pack(AgentText(text)), "speaker")
            to_speaker.send(m.encode(m.DataReady(request_id=request_id, src="client", dst="speaker", seq=0, eos=False,
                                                 payload=payload, sent_ns=time.monotonic_ns(),
                                                 params=TurnRequest(session_id="s"))))

        say("r1", "hello")
        handoff = _recv(listener)
        assert isinstance(handoff, m.DataReady) and handoff.payload.shm is not None  # held: never acked
        prefix = segment_prefix(run_id, "speaker")
        assert shm.list_segments(prefix) != []
        say("r2", CRASH)
        served.join(timeout=20)
        assert not served.is_alive()
        assert host.crash is not None and host.crash.code is ErrorCode.STAGE_CRASHED
        assert shm.list_segments(prefix) == []
        assert all(sock.closed for sock in [*host.inboxes, *host.pushes.values(), host.sub]) and host.ctx.closed
    finally:
        host.running = False
        served.join(timeout=10)
        for sock in (control, coordinator, listener, to_speaker):
            sock.close(linger=0)
        ctx.term()
        shm.sweep(shm.run_prefix(run_id))
