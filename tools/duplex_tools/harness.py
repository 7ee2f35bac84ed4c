"""Running a real server and making real speech, for tests and scripted scenarios."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import wave
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np

from duplex.audio import resample

_READY = re.compile(r"demo page: (http://\S+?)/?$")


class ServerProcess:
    """``duplex serve`` in a child process; ``url`` once it printed that it is ready. ``command``
    starts another one (another venv's ``duplex serve``, scripts/serve.sh); ``args`` follow it."""

    def __init__(self, args: list[str], ready_timeout: float = 90.0, cwd: str | None = None,
                 command: list[str] | None = None) -> None:
        self.command = command or [sys.executable, "-m", "duplex.cli", "serve"]
        self.args = args
        self.ready_timeout = ready_timeout
        self.cwd = cwd
        self.url: str | None = None
        self.output: list[str] = []
        self._proc: subprocess.Popen | None = None

    def __enter__(self) -> ServerProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> str:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self._proc = subprocess.Popen([*self.command, *self.args], cwd=self.cwd,
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        ready = threading.Event()
        threading.Thread(target=self._read_output, args=(ready,), daemon=True).start()
        if not ready.wait(self.ready_timeout) or self.url is None:
            self.stop()
            raise RuntimeError("duplex serve did not become ready:\n" + "".join(self.output[-40:]))
        return self.url

    def _read_output(self, ready: threading.Event) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            self.output.append(line)
            match = _READY.search(line.strip())
            if match:
                self.url = match.group(1)
                ready.set()
        ready.set()  # the process ended

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def terminate(self) -> None:
        """SIGTERM, as a service manager or an orchestrator stops it: the server drains."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)

    def wait(self, timeout: float) -> int:
        """The exit code, once the process ended (raises subprocess.TimeoutExpired)."""
        assert self._proc is not None
        return self._proc.wait(timeout)

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGINT (as Ctrl-C would), then wait; kill only if it hangs. Returns the exit code."""
        if self._proc is None:
            return None
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGINT)
            try:
                self._proc.wait(timeout)
            except subprocess.TimeoutExpired:
                # pytest shows this with the failure: the server's own report of where it hung
                print(f"duplex serve did not stop within {timeout:g} s; its last output:\n"
                      + "".join(self.output[-150:]), file=sys.stderr, flush=True)
                self._proc.kill()
                self._proc.wait(10)
        return self._proc.returncode


def espeak(text: str, rate: int = 48000, voice: str = "en-us", words_per_minute: int = 165) -> np.ndarray:
    """Speech from espeak-ng as float32 mono at ``rate`` (leading/trailing silence trimmed)."""
    if shutil.which("espeak-ng") is None:
        raise RuntimeError("espeak-ng is not installed (apt-get install espeak-ng)")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "speech.wav"
        subprocess.run(["espeak-ng", "-v", voice, "-s", str(words_per_minute), "-w", str(path), text],
                       check=True, capture_output=True, timeout=60)
        samples, source_rate = read_wav(path)
    samples = resample(samples, source_rate, rate)
    loud = np.flatnonzero(np.abs(samples) > 0.01)
    return samples[loud[0]:loud[-1] + 1] if loud.size else samples


def read_wav(path: str | Path) -> tuple[np.ndarray, int]:
    with wave.open(str(path)) as w:
        if w.getsampwidth() != 2:
            raise ValueError(f"{path}: only 16-bit PCM WAV is supported")
        data = np.frombuffer(w.readframes(w.getnframes()), np.int16).astype(np.float32) / 32768.0
        return data.reshape(-1, w.getnchannels()).mean(axis=1), w.getframerate()


def write_wav(path: str | Path, samples: np.ndarray, rate: int) -> None:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes((np.clip(samples, -1, 1) * 32767).astype(np.int16).tobytes())


def server_stats(url: str, headers: dict[str, str] | None = None) -> dict:
    """``GET /duplex/stats`` of a running server (asserting it answered)."""
    reply = httpx.get(f"{url}/duplex/stats", headers=headers, timeout=10)
    assert reply.status_code == 200, reply.text
    return reply.json()


async def wait_stats(url: str, accept: Callable[[dict], bool], timeout: float = 10.0,
                     headers: dict[str, str] | None = None) -> dict:
    """``GET /duplex/stats`` until ``accept`` says yes (returns those stats); fails after ``timeout``
    naming what it last saw."""
    deadline = time.monotonic() + timeout
    while True:
        current = await asyncio.to_thread(server_stats, url, headers)
        if accept(current):
            return current
        assert time.monotonic() < deadline, f"stats never settled: {current}"
        await asyncio.sleep(0.1)
