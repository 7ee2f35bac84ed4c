"""The English words the session reads in transcripts, in one place: what an overlap's words say
(``overlap_words.py``: a backchannel, or words that take the floor) and whether a turn's last words
leave it open (``endpoint.py``). Another language is another set of these lists."""

from __future__ import annotations

# -- over the agent's reply (overlap_words.py) ---------------------------------------------------
# Each a phrase of normalised words; a transcript made only of these is a backchannel.
BACKCHANNELS: frozenset[tuple[str, ...]] = frozenset(tuple(phrase.split()) for phrase in (
    "uh huh", "uhhuh", "uh hum", "mm hmm", "mmhmm", "mhm", "mm", "mmm", "hmm", "hm", "um hmm", "aha", "ah", "oh",
    "ooh", "yeah", "yea", "yes", "yep", "yup", "ya", "okay", "ok", "kay", "alright", "all right", "right",
    "sure", "i see", "got it", "gotcha", "cool", "nice", "great", "good", "wow", "indeed", "exactly",
    "of course", "that's right", "makes sense", "sounds good", "fine", "true",
    "ow", "aw", "huh", "eh", "er", "um", "uh", "whoa", "ha", "haha",  # interjections
))
# Words that take the floor on their own: a one-word overlap is most often a backchannel Whisper
# misheard ("I" for a Piper "uh-huh", "Emama." for its "mm-hmm"), unless it is one of these.
FLOOR_WORDS = frozenset(("stop", "wait", "sorry", "no", "nope", "nah", "hold", "hang", "hey", "excuse", "pardon",
                         "actually", "but", "what", "why", "how", "cancel", "pause", "quiet", "enough", "listen",
                         "hello", "repeat", "again", "help", "operator"))

# -- at the end of a turn (endpoint.py) ----------------------------------------------------------
# Words an English turn rarely ends on. Kept short: a word here vetoes the model's "complete".
# No sentence ends on these, asked or told: fillers, articles, conjunctions, possessives, a
# contraction waiting for its verb ("Can I get a?" is cut short whatever the ASR wrote).
NEVER_LAST = frozenset(("um", "uh", "er", "erm", "ah", "the", "a", "an", "and", "but", "or", "because", "if",
                        "than", "my", "your", "our", "their", "its", "i'd", "i'm", "i'll", "we're", "you're"))
# A statement rarely ends on these, but a question often does: a stranded preposition ("Who is it
# for?", "What are you looking at?") or verb ("What would you like?", "Could you tell me what time
# it is?"), so in a transcript the ASR wrote as a question they do not hang.
HANGING_WORDS = NEVER_LAST | frozenset(("to", "of", "for", "with", "at", "from", "by", "about", "into", "want",
                                        "like", "is"))


# -- the ASR's punctuation (endpoint.py, turn_model.py) --------------------------------------------
def closes(text: str) -> bool:
    """The transcript ends a sentence (the ASR's . ! ? or an ellipsis' trailing off, which
    ``words_hang`` reads)."""
    return text.rstrip(" \"')").endswith((".", "!", "?", "\u2026"))


def asks(text: str) -> bool:
    """The transcript ends a question (the ASR's "?", from the syntax and the rising voice)."""
    return text.rstrip(" \"')").endswith("?")
