"""What a caller said over the agent's reply, for the barge-in that listens (``overlap.py``).

The words: a transcript is normalised (lower case, punctuation and Whisper's bracketed sound
notes like "(coughs)" dropped, "uh-huh" and "uh huh" alike, lone letters other than "I" dropped:
Whisper spells a hum out as "M. H. N.") and is a backchannel when every word belongs to one of
``words.BACKCHANNELS`` ("yeah okay", "oh I see"); interjections alone ("oh", "ah", "um", "huh", and
"ow", Whisper's hearing of a Piper "uh-huh") take no floor either. Other words take the floor
(``what_words_say``) when there are ``barge_in.min_words`` of them, or one of ``words.FLOOR_WORDS``
("stop", "wait", "sorry"); a lone other word ("I", "Emama.": Whisper's hearing of a Piper
"uh-huh" and "mm-hmm") says too little, and the sound decides. No words at all (noise, a
cough) says nothing.

Whisper makes words up from a noise (measured on a 0.3 s cough: "I'm not a good guy.", on a
0.15 s burst: "I'm sorry.", over a sneeze or a door slam: "I'm not sure."), so words count only
when the sound could have said them (``credible``): at least ``noise_ms`` voiced, ``MS_PER_WORD``
of voiced audio per word, and, where the recogniser says how sure it was, a mean log-probability
per token of at least ``barge_in.min_logprob`` (made-up words come with far less confidence), and
not too few for the voice: over a long hum Whisper writes a few made-up words ("Em em them.",
"Image in.", "Bubble, bubble."), so two or more words, none of them a floor word, that came with
more than ``barge_in.max_voiced_ms_per_word`` of voiced audio each are no words either (or more
than ``max_voiced_ms_per_word_other`` where the sound is more likely a backchannel or a noise:
Whisper's "And make him." over a "mhm" comes as fast as a slow caller's words).

The ears: ``OverlapEars`` sends the overlap's audio to the pipeline as an ``OverlapProbe``
request (one per paused reply; the runtime routes it to the ASR stage and back, no further), and
hands the session each ``Transcript`` and the probe's end. Every probe ends: its input is closed
when the sound ends (the ASR's final transcript), and it is aborted when the overlap is settled
first or the session closes.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Coroutine
from typing import Any

from duplex.runtime.contract import CallerAudio, OverlapProbe, Transcript
from duplex.session.port import Turn, TurnEnded, VoiceRuntime
from duplex.session.words import BACKCHANNELS, FLOOR_WORDS

_LONGEST = max(len(phrase) for phrase in BACKCHANNELS)
MS_PER_WORD = 100  # voiced audio per word, at the least (10 words a second: faster than anyone speaks)
_NOTES = re.compile(r"\([^)]*\)|\[[^\]]*\]|\*[^*]*\*")  # Whisper's "(coughs)", "[Music]", "*sigh*"
_WORD = re.compile(r"[a-z]+(?:'[a-z]+)?")


def spoken_words(text: str) -> list[str]:
    """The words of a transcript, normalised; [] when it holds no words (silence, a noise)."""
    words = _WORD.findall(_NOTES.sub(" ", text.lower()).replace("-", " "))
    return [word for word in words if len(word) > 1 or word == "i"]


def credible(words: list[str], voiced_ms: int, noise_ms: int, avg_logprob: float | None = None,
             min_logprob: float | None = None, max_ms_per_word: int | None = None) -> bool:
    """Whether a sound with ``voiced_ms`` of voice could have said ``words``, heard with
    ``avg_logprob`` (None: unknown) (see above)."""
    sure = avg_logprob is None or min_logprob is None or avg_logprob >= min_logprob
    return (sure and voiced_ms >= noise_ms and len(words) * MS_PER_WORD <= voiced_ms
            and not _too_few_for_the_voice(words, voiced_ms, max_ms_per_word))


def _too_few_for_the_voice(words: list[str], voiced_ms: int, max_ms_per_word: int | None) -> bool:
    """A hum's made-up words (see ``counts_the_pace``)."""
    return max_ms_per_word is not None and counts_the_pace(words) and voiced_ms > max_ms_per_word * len(words)


def counts_the_pace(words: list[str]) -> bool:
    """Whether the pace of ``words`` can make them no words: a lone word says too little anyway
    (``Said.TOO_FEW``), and a floor word is a caller's even when drawn out ("wait, wait")."""
    return len(words) >= 2 and not any(word in FLOOR_WORDS for word in words)


class Said(enum.Enum):
    """What an overlap's words say."""

    NOTHING = "nothing"  # no words
    BACKCHANNEL = "backchannel"  # "uh-huh", "yeah okay": the reply goes on
    FLOOR = "floor"  # they take the floor: an interruption
    TOO_FEW = "too_few"  # a lone other word ("I", "way"): it may begin a sentence; the sound decides


def what_words_say(words: list[str], min_words: int) -> Said:
    """``words`` (normalised): a backchannel, or words that take the floor (``min_words`` of them,
    or one of ``FLOOR_WORDS``), or too few to say."""
    if not words:
        return Said.NOTHING
    if is_backchannel(words):
        return Said.BACKCHANNEL
    if len(words) >= min_words or any(word in FLOOR_WORDS for word in words):
        return Said.FLOOR
    return Said.TOO_FEW


def is_backchannel(words: list[str]) -> bool:
    """Whether ``words`` (non-empty, normalised) are backchannel phrases one after another."""
    reachable = [True] + [False] * len(words)  # reachable[i]: words[:i] split into phrases
    for end in range(1, len(words) + 1):
        reachable[end] = any(reachable[end - n] and tuple(words[end - n:end]) in BACKCHANNELS
                             for n in range(1, min(_LONGEST, end) + 1))
    return bool(words) and reachable[-1]


class OverlapEars:
    """The pipeline's ASR listening to one overlap at a time (see the module's doc)."""

    def __init__(self, runtime: VoiceRuntime, session_id: str,
                 spawn: Callable[[Coroutine[Any, Any, None]], None],
                 on_words: Callable[[Transcript], None], on_end: Callable[[], None]) -> None:
        self._runtime, self._session_id, self._spawn = runtime, session_id, spawn
        self._on_words, self._on_end = on_words, on_end
        self._turn: Turn | None = None
        self.input_open = False  # the probe still takes audio
        self.probes = 0  # probes started (stats)

    @property
    def live(self) -> bool:
        return self._turn is not None

    def start(self, audio: CallerAudio) -> None:
        """A new overlap: a probe with its audio so far (the one before, if any, is aborted)."""
        self.stop()
        try:
            turn = self._runtime.start(OverlapProbe(session_id=self._session_id))
        except RuntimeError:  # the runtime is shutting down: the sound decides
            return
        self._turn, self.input_open = turn, True
        self.probes += 1
        turn.feed(audio)
        self._spawn(self._listen(turn))

    def feed(self, audio: CallerAudio, eos: bool = False) -> None:
        if self._turn is not None and self.input_open:
            self._turn.feed(audio, eos=eos)
            self.input_open = not eos

    def stop(self) -> None:
        """The overlap is settled: its probe is not wanted any more (idempotent)."""
        turn, self._turn, self.input_open = self._turn, None, False
        if turn is not None:
            turn.abort()

    async def _listen(self, turn: Turn) -> None:
        """Read the probe to its end (so nothing of it is left behind), telling only the current one."""
        async for event in turn.events():
            if self._turn is not turn:
                continue  # stopped: its aborted end is read and dropped
            if isinstance(event, Transcript):
                self._on_words(event)
            elif isinstance(event, TurnEnded):
                self._turn, self.input_open = None, False
                self._on_end()
