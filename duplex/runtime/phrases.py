"""Cutting a streamed reply into speakable phrases: the thinker streams text deltas, and waiting
for the whole reply would add its full decode time to the time to first audio. ``PhraseSplitter``
cuts the stream at sentence ends (and at clause breaks once a phrase is long enough to sound
natural); every TTS stage (in process or calling a server) voices phrase by phrase
(``contract.PhraseSplitter``)."""

from __future__ import annotations

import re
from dataclasses import dataclass

# A mark right after a letter ends a phrase at once, without waiting for the next token to
# bring the space; after a digit ("$5.50", "1,000") it waits for the space.
_SENTENCE_END = re.compile(r"(?:(?<=[A-Za-z])[.!?]+[\"')\]]*(?=\s|$)|[.!?]+[\"')\]]*\s)")
_CLAUSE_END = re.compile(r"(?:(?<=[A-Za-z])[,;:\u2014](?=\s|$)|[,;:\u2014]\s)")
_SPEAKABLE = re.compile(r"[A-Za-z0-9]")
_BREAK_BEFORE = ("and", "but", "or", "so", "because")


@dataclass
class PhraseSplitter:
    """Accumulates streamed text and hands out speakable phrases in order.

    The first phrase decides when the agent starts to speak, so it is cut sooner: at a comma
    after one word ("Sure,"), or before a conjunction ("A regular is five dollars | and ...").
    Later phrases wait for longer clauses, which sound more natural.
    """

    first_clause_words: int = 1  # a comma ends the first phrase after this many words
    clause_words: int = 4  # ... and later phrases after this many
    first_break_words: int = 3  # the first phrase may end before "and"/"but"/... after this many
    max_phrase_words: int = 24  # no phrase grows past this without a cut at a space
    buffer: str = ""
    phrases_out: int = 0

    def push(self, text: str) -> list[str]:
        self.buffer += text
        phrases = []
        while (cut := self._next_cut()) is not None:
            phrase, self.buffer = self.buffer[:cut].strip(), self.buffer[cut:]
            if _SPEAKABLE.search(phrase):
                phrases.append(phrase)
                self.phrases_out += 1
        return phrases

    def flush(self) -> list[str]:
        phrase, self.buffer = self.buffer.strip(), ""
        if not _SPEAKABLE.search(phrase):
            return []
        self.phrases_out += 1
        return [phrase]

    def _next_cut(self) -> int | None:
        first = self.phrases_out == 0
        if match := _SENTENCE_END.search(self.buffer):
            return match.end()
        min_words = self.first_clause_words if first else self.clause_words
        for match in _CLAUSE_END.finditer(self.buffer):
            if len(self.buffer[: match.start()].split()) >= min_words:
                return match.end()
        words = self.buffer.split(" ")
        if first and (cut := self._conjunction_cut(words)) is not None:
            return cut
        if len(words) > self.max_phrase_words:
            return len(" ".join(words[: self.max_phrase_words])) + 1
        return None

    def _conjunction_cut(self, words: list[str]) -> int | None:
        """Offset just before a conjunction, cut as soon as the conjunction arrives: waiting for
        the next word would cost a decode step (~75 ms). A word that merely starts like one
        ("android") comes from the LLM as a single token, so it is not split here."""
        for index in range(1, len(words)):
            spoken = [w for w in words[:index] if w]
            if words[index].lower() in _BREAK_BEFORE and len(spoken) >= self.first_break_words:
                return len(" ".join(words[:index])) + 1
        return None
