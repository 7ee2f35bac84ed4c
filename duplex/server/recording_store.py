"""The recordings folder as the recordings API reads it (``edge/http/recordings.py``'s
``RecordingStore``): each recording is ``<id>.wav``, ``<id>.jsonl`` and a sidecar ``<id>.json``
saying whose call it was (an owner hash, never a secret), which call, and when it began. A
recording without a sidecar (made before sidecars were written) belongs to the server alone."""

from __future__ import annotations

from pathlib import Path

import msgspec

from duplex.edge.http.recordings import RecordingInfo

WAV_HEADER = 44
BYTES_PER_FRAME = 4  # 16-bit stereo
SUFFIXES = (".wav", ".jsonl", ".json")


class Sidecar(msgspec.Struct, kw_only=True):
    call_id: str
    owner: str | None  # auth.owner_of(the opener's credential); None: the server's (a phone call)
    created_at: float  # epoch seconds
    reason: str  # why it is recorded: all, share, on_request


_decode_sidecar = msgspec.json.Decoder(Sidecar)


class RecordingFolder:
    def __init__(self, folder: Path, rate: int) -> None:
        self.folder = folder
        self.rate = rate

    def write_sidecar(self, recording_id: str, sidecar: Sidecar) -> None:
        self._path(recording_id, ".json").write_bytes(msgspec.json.encode(sidecar))

    # -- RecordingStore -------------------------------------------------------------------------
    def recordings(self) -> list[RecordingInfo]:
        found = (self.find(path.stem) for path in self.folder.glob("*.wav"))
        return sorted((info for info in found if info is not None), key=lambda info: info.created_at)

    def find(self, recording_id: str) -> RecordingInfo | None:
        wav = self._path(recording_id, ".wav")
        try:
            size = wav.stat().st_size
        except OSError:
            return None
        try:
            sidecar = _decode_sidecar.decode(self._path(recording_id, ".json").read_bytes())
        except (OSError, msgspec.DecodeError, msgspec.ValidationError):  # none, or unreadable: the server's
            sidecar = Sidecar(call_id=recording_id, owner=None, created_at=wav.stat().st_mtime, reason="unknown")
        frames = max(0, size - WAV_HEADER) // BYTES_PER_FRAME  # a call still going has its header unwritten
        return RecordingInfo(id=recording_id, call_id=sidecar.call_id, owner=sidecar.owner,
                             created_at=sidecar.created_at, duration_s=round(frames / self.rate, 3), bytes=size)

    def wav(self, recording_id: str) -> Path:
        return self._path(recording_id, ".wav")

    def events(self, recording_id: str) -> Path:
        return self._path(recording_id, ".jsonl")

    def delete(self, recording_id: str) -> None:
        for suffix in SUFFIXES:
            self._path(recording_id, suffix).unlink(missing_ok=True)

    def _path(self, recording_id: str, suffix: str) -> Path:
        path = self.folder / f"{recording_id}{suffix}"
        if path.parent != self.folder or "/" in recording_id or recording_id.startswith("."):
            raise ValueError(f"not a recording id: {recording_id!r}")  # the API checks ids first; this is a backstop
        return path
