"""The words a caller heard of a reply: each audio chunk says which text it voices
(``AgentAudio.text``, set by TTS stages), and the playout says how much audio was played; the
chunks played in full give their text, the chunk playing at the cut gives the words that lie
within its played share (by characters: speech time follows the letters more than the words)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field


@dataclass
class VoicedText:
    """Per response: where each chunk's audio ends (ms of the reply's audio) and its text."""

    chunks: list[tuple[float, str]] = field(default_factory=list)
    total_ms: float = 0.0

    def add(self, ms: float, text: str) -> None:
        self.total_ms += ms
        self.chunks.append((self.total_ms, text))

    def heard(self, played_ms: float) -> str | None:
        """The text of the first ``played_ms`` of audio; None if no chunk said its text."""
        if not any(text.strip() for _, text in self.chunks):
            return None
        words: list[str] = []
        start = 0.0
        for end, text in self.chunks:
            if end <= played_ms:
                words.extend(text.split())
            else:
                share = (played_ms - start) / (end - start) if end > start else 0.0
                words.extend(_words_within(text.strip(), share))
                break
            start = end
        return " ".join(words)


def _words_within(text: str, share: float) -> list[str]:
    budget = max(0.0, share) * len(text)
    return [m.group() for m in re.finditer(r"\S+", text) if m.end() <= budget]
