"""Stage processes: addresses, spawn, the ready handshake, and a clean end."""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import socket
import tempfile
from collections.abc import Mapping

from duplex.config.pipeline import PipelineConfig
from duplex.lifecycle import end_process
from duplex.runtime.stage import COORDINATOR
from duplex.runtime.stage_host import Builder, HostSpec, host_main

CONTROL = "control"


def make_addresses(cfg: PipelineConfig, run_dir: str) -> dict[str, str]:
    """Inbox address per stage, the coordinator's inbox, and the control broadcast."""
    names = [COORDINATOR, CONTROL, *(s.name for s in cfg.stages)]
    if cfg.control.transport == "ipc":
        return {name: f"ipc://{os.path.join(run_dir, name)}.sock" for name in names}
    host = cfg.control.host
    if cfg.control.base_port:
        return {name: f"tcp://{host}:{cfg.control.base_port + i}" for i, name in enumerate(names)}
    return {name: f"tcp://{host}:{_free_port(host)}" for name in names}


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


class StageProcesses:
    """The OS processes of one run, one per distinct ``process`` name."""

    def __init__(self, cfg: PipelineConfig, builders: Mapping[str, Builder], run_id: str) -> None:
        self.cfg = cfg
        self.builders = builders
        self.run_id = run_id
        self.run_dir = tempfile.mkdtemp(prefix=f"duplex-{run_id}-")
        self.addresses = make_addresses(cfg, self.run_dir)
        self.groups = {name: [s.name for s in stages] for name, stages in cfg.processes().items()}
        self.procs: dict[str, mp.process.BaseProcess] = {}
        self.restarts: dict[str, int] = {name: 0 for name in self.groups}
        self._mp = mp.get_context("spawn")

    def spawn(self, process: str, tombstones: list[str] | None = None) -> mp.process.BaseProcess:
        spec = HostSpec(run_id=self.run_id, process=process, pipeline=self.cfg.model_dump(),
                        addresses=self.addresses, tombstones=tombstones or [],
                        use_shm=self.cfg.control.transport == "ipc")
        # only this process's builders: each is pickled by reference, so its module gets imported
        needed = {s.builder: self.builders[s.builder] for s in self.cfg.processes()[process]}
        proc = self._mp.Process(target=host_main, args=(spec, needed),
                                name=f"duplex-{process}", daemon=True)
        proc.start()
        self.procs[process] = proc
        return proc

    def dead(self) -> list[str]:
        return [name for name, proc in self.procs.items() if proc.exitcode is not None]

    def terminate(self, timeout: float = 5.0) -> None:
        for proc in self.procs.values():
            proc.join(timeout)
        for proc in self.procs.values():
            end_process(proc, 0)
        for proc in self.procs.values():
            proc.close()
        self.procs.clear()
        shutil.rmtree(self.run_dir, ignore_errors=True)
