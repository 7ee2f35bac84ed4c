"""Opt-in call recording (``--record DIR``; off by default): per call ``<call id>.wav``, 16 kHz
16-bit stereo, the caller on the left and the agent on the right on one timeline, and
``<call id>.jsonl``, the call's events with their time on that timeline.

The agent channel is what the server handed the transport, frame by frame, on each frame's due
time: what the caller heard (less the network's delay), barge-in cuts included: the reply stops
in the recording where its audio was flushed. The caller channel is their audio placed where the
session's own input clock (``session.clock.InputClock``: the least-delayed arrival, jitter
removed) says it was captured, the clock barge-in times are measured on. Both are written out as
they come (a second or so behind), so a long call does not pile up in memory.

Limits: before each new call, recordings older than ``max_age_s`` go, then the oldest until the
folder is under ``max_bytes``; a call's own recording stops growing at ``max_bytes``. A recording's
files (``.wav``, ``.jsonl``, its sidecar ``.json``: ``recording_store.py``) go together.

Which calls are recorded is the policy's (``recording_policy.py``).
"""

from __future__ import annotations

import logging
import re
import time
import wave
from pathlib import Path

import msgspec
import numpy as np

from duplex.audio import SESSION_RATE, Resampler
from duplex.server.recording_store import SUFFIXES, RecordingFolder, Sidecar
from duplex.session.clock import InputClock
from duplex.session.playout import OutputFormat
from duplex.session.realtime import events as ev

log = logging.getLogger("duplex.recording")
RATE = SESSION_RATE  # the caller's audio comes at this rate; the agent's is converted to it
CALLER, AGENT = 0, 1
WRITE_BEHIND_S = 1.0  # written out once both channels are this far ahead ...
MAX_WAIT_S = 3.0  # ... or one of them is, the other having gone quiet
_encoder = msgspec.json.Encoder()
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")  # a SIP Call-ID may hold '@', '/' ...: not in a file name


class Recorder:
    def __init__(self, folder: Path, max_bytes: int, max_age_s: float) -> None:
        self.folder = folder
        self.max_bytes = max_bytes
        self.max_age_s = max_age_s
        folder.mkdir(parents=True, exist_ok=True)
        self.store = RecordingFolder(folder, RATE)  # what the recordings API reads

    def open_call(self, call_id: str, output_format: OutputFormat, owner: str | None = None,
                  reason: str = "all") -> CallRecording:
        self.prune()
        name = _UNSAFE.sub("_", call_id).lstrip(".") or "call"  # no hidden files, no "..": see recordings.py
        self.store.write_sidecar(name, Sidecar(call_id=call_id, owner=owner, created_at=time.time(), reason=reason))
        return CallRecording(self.folder / f"{name}.wav", self.folder / f"{name}.jsonl", output_format,
                             self.max_bytes)

    def prune(self) -> None:
        """By recording (its files together), the least recently written first."""
        groups: dict[str, list[Path]] = {}
        for path in self.folder.iterdir():
            if path.suffix in SUFFIXES and path.is_file():
                groups.setdefault(path.stem, []).append(path)
        stats = {stem: [p.stat() for p in paths] for stem, paths in groups.items()}
        order = sorted(groups, key=lambda stem: max(s.st_mtime for s in stats[stem]))
        now = time.time()
        total = sum(s.st_size for each in stats.values() for s in each)
        for stem in order:
            too_old = now - max(s.st_mtime for s in stats[stem]) > self.max_age_s
            if not too_old and total <= self.max_bytes:
                continue
            total -= sum(s.st_size for s in stats[stem])
            for path in groups[stem]:
                path.unlink(missing_ok=True)


class _Channel:
    """One side's audio not yet written: chunks placed at sample positions of the timeline."""

    def __init__(self) -> None:
        self.chunks: list[tuple[int, np.ndarray]] = []
        self.end: int | None = None  # position after its last sample so far

    def place(self, start: int, samples: np.ndarray, floor: int) -> None:
        """At ``start``; over what came before, where they overlap (a later, less delayed view)."""
        if start < floor:  # that part of the timeline was written already
            samples, start = samples[floor - start:], floor
        if len(samples):
            self.chunks.append((start, samples))
            self.end = max(self.end or 0, start + len(samples))

    def cut(self, written: int, upto: int, out: np.ndarray) -> None:
        """Move what lies in [written, upto) into ``out`` (a view of that span)."""
        kept = []
        for start, samples in self.chunks:
            end = start + len(samples)
            a, b = max(start, written), min(end, upto)
            if b > a:
                out[a - written:b - written] = samples[a - start:b - start]
            if end > upto:
                kept.append((max(start, upto), samples[max(start, upto) - start:]))
        self.chunks = kept


class CallRecording:
    """A ``CallTap`` that writes the call's WAV and events."""

    def __init__(self, wav_path: Path, events_path: Path, output_format: OutputFormat, max_bytes: int) -> None:
        self.wav_path = wav_path
        self._t0 = time.monotonic()
        self._max_frames = max(0, (max_bytes - 44) // 4)
        self._wav = wave.open(str(wav_path), "wb")  # noqa: SIM115 (open for the call's lifetime)
        self._wav.setnchannels(2)
        self._wav.setsampwidth(2)
        self._wav.setframerate(RATE)
        self._events = open(events_path, "wb")  # noqa: SIM115
        self._format = output_format
        self._to_rate = Resampler(RATE)  # the agent's frames, mono at RATE
        self._caller_clock = InputClock(RATE)
        self._channels = (_Channel(), _Channel())
        self._written = 0
        self._closed = False

    def _position(self, at: float) -> int:
        return round((at - self._t0) * RATE)

    def event(self, event: ev.ServerEvent, request_id: str | None) -> None:
        if self._closed:
            return
        line = {"t": round(time.monotonic() - self._t0, 4), "request_id": request_id, "event": event}
        try:
            self._events.write(_encoder.encode(line) + b"\n")
        except OSError as exc:
            self._give_up(exc)

    def caller_audio(self, samples: np.ndarray, arrival: float) -> None:
        pcm = np.asarray(samples, np.int16)  # already at the session rate, RATE
        captured_end = self._caller_clock.advance(len(pcm), arrival)
        self._add(CALLER, self._position(captured_end) - len(pcm), pcm)

    def agent_frame(self, pcm: np.ndarray, due: float, late_s: float, starved: bool) -> None:
        mono = self._to_rate(np.asarray(pcm, np.int16), self._format.sample_rate, self._format.channels)
        self._add(AGENT, self._position(due), mono)

    def _add(self, channel: int, start: int, pcm: np.ndarray) -> None:
        if self._closed:
            return
        self._channels[channel].place(start, pcm, self._written)
        ends = [c.end for c in self._channels]
        known = [e for e in ends if e is not None]
        upto = min(known) if len(known) == 2 else 0
        upto = max(upto, max(known) - round(MAX_WAIT_S * RATE))
        if upto - self._written >= WRITE_BEHIND_S * RATE:
            self._flush(upto)

    def _flush(self, upto: int) -> None:
        upto = min(upto, self._max_frames)
        if upto <= self._written:
            return
        out = np.zeros((upto - self._written, 2), np.int16)
        for index, channel in enumerate(self._channels):
            channel.cut(self._written, upto, out[:, index])
        try:
            self._wav.writeframes(out.tobytes())
        except OSError as exc:
            self._give_up(exc)
            return
        self._written = upto

    def _give_up(self, exc: OSError) -> None:
        """A full or broken disk ends the recording, never the call (this runs in its media path)."""
        log.error("recording %s stopped: %s", self.wav_path, exc)
        self._closed = True
        for handle in (self._wav, self._events):
            try:
                handle.close()
            except OSError:
                pass

    def close(self) -> None:
        if self._closed:
            return
        ends = [c.end for c in self._channels if c.end is not None]
        if ends:
            self._flush(max(ends))
        if self._closed:  # the flush gave up
            return
        self._closed = True
        self._wav.close()
        self._events.close()
        log.info("recorded %s (%.1f s)", self.wav_path, self._written / RATE)
