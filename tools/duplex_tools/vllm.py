"""A real vLLM server (its CPU build, in the venv ``scripts/setup_vllm.sh`` makes) for tests and
benches of the engine thinker: started on a free port, on the Gemma 3 270M folder the local
pipeline already converts, waited for on ``/health`` (bounded), read through ``/metrics``,
stopped (its whole process group) at the end.

The flags are those the field notes measured: bf16, 2048-token context, a chat template for the
base model (``duplex/configs/base-gemma-chat.jinja``), prefix caching, the hermes tool parser
(a named ``tool_choice`` needs one), eager mode (37 s to start instead of 80-110 s), a 1 GiB KV
cache, and a compile cache of its own (``VLLM_CACHE_ROOT``).
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import tempfile
import time
from importlib.resources import files
from pathlib import Path

import httpx

VLLM_VERSION = "0.32.0"
SERVED_NAME = "gemma"
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+([0-9.eE+-]+|NaN|\+Inf|-Inf)$")


def vllm_venv() -> Path:
    default = Path(os.environ.get("DUPLEX_CACHE") or Path.home() / ".cache" / "duplex") / f"vllm-cpu-{VLLM_VERSION}"
    return Path(os.environ.get("DUPLEX_VLLM_VENV") or default)


def vllm_available() -> str | None:
    """None if the vLLM venv is ready, else why not (what to run)."""
    venv = vllm_venv()
    if not (venv / ".duplex-complete").is_file():
        return f"no vLLM venv at {venv}: run bash scripts/setup_vllm.sh"
    return None


def chat_template() -> Path:
    return Path(str(files("duplex.configs").joinpath("base-gemma-chat.jinja")))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text -> {name: value}, summed over label sets (one engine, one model)."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line.strip())
        if match:
            values[match.group(1)] = values.get(match.group(1), 0.0) + float(match.group(3))
    return values


class VLLMServer:
    """``with VLLMServer(model_dir) as engine: engine.base_url`` (``.../v1``)."""

    def __init__(self, model_dir: Path, port: int | None = None, start_timeout_s: float = 600.0,
                 extra_args: tuple[str, ...] = (), env: dict[str, str] | None = None) -> None:
        self.model_dir = model_dir
        self.port = port or free_port()
        self.start_timeout_s = start_timeout_s
        self.extra_args = extra_args
        self.env = env or {}
        self._http: httpx.Client | None = None
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.model = SERVED_NAME
        self._proc: subprocess.Popen | None = None
        self._dir = tempfile.TemporaryDirectory(prefix="duplex-vllm-")
        self.log_path = Path(self._dir.name) / "vllm.log"

    def __enter__(self) -> VLLMServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def command(self) -> list[str]:
        return [str(vllm_venv() / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server",
                "--model", str(self.model_dir), "--served-model-name", SERVED_NAME, "--host", "127.0.0.1",
                "--port", str(self.port), "--dtype", "bfloat16", "--max-model-len", "2048",
                "--chat-template", str(chat_template()), "--enforce-eager", "--enable-prefix-caching",
                "--enable-auto-tool-choice", "--tool-call-parser", "hermes", *self.extra_args]

    def start(self) -> None:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
               "VLLM_CACHE_ROOT": str(Path(self._dir.name) / "cache"), "VLLM_NO_USAGE_STATS": "1",
               "DO_NOT_TRACK": "1", **self.env}
        with open(self.log_path, "wb") as log:
            # its own process group: vLLM runs an API server and an engine core process; stop() ends both
            self._proc = subprocess.Popen(self.command(), env=env, stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True)
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"vLLM exited with {self._proc.returncode} while starting:\n{self.log_tail()}")
            if self.healthy():
                return
            time.sleep(0.5)  # polling a process we do not control: there is no event to wait on
        self.stop()
        raise RuntimeError(f"vLLM was not healthy within {self.start_timeout_s:.0f} s:\n{self.log_tail()}")

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def healthy(self) -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=2.0).status_code == 200
        except httpx.HTTPError:
            return False

    def metrics(self) -> dict[str, float]:
        if self._http is None:  # one kept-alive connection: a poll costs one request, not a connect
            self._http = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=5.0)
        reply = self._http.get("/metrics")
        reply.raise_for_status()
        return parse_metrics(reply.text)

    def running_requests(self) -> float:
        return self.metrics().get("vllm:num_requests_running", 0.0)

    def prefix_cache_hits(self) -> float:
        metrics = self.metrics()
        return metrics.get("vllm:prefix_cache_hits_total", metrics.get("vllm:prefix_cache_hits", 0.0))

    def kill(self) -> None:
        """Kill the engine at once (SIGKILL to its process group), as a crash would."""
        if self._proc is not None and self._proc.poll() is None:
            os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait(timeout=30)

    def stop(self) -> None:
        if self._http is not None:
            self._http.close()
            self._http = None
        proc = self._proc
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
        if proc is not None:
            try:  # children left in the group (the engine core) go too
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self._proc = None
        self._dir.cleanup()

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""
