"""What the corpus holds: its speakers, variants and conditions, and how it is split.

A *variant* is one backchannel form, noise kind, interruption or pause position; a *cell* is a
variant under one condition; a *clip* is one speaker's (or, for noises, one seeded instance's)
rendering of a variant under a condition. Speakers are split into a development part and a
held-out part (alternately within each synthesiser), and the corpus can also be split by
synthesiser (``espeak`` / ``piper``), so that nothing learns one synthesiser's artefacts."""

from __future__ import annotations

from dataclasses import dataclass

CATEGORIES = ("pause", "backchannel", "noise", "interruption", "smooth")
CONDITIONS = ("clean", "snr20", "snr10", "room", "phone")
SPLITS = ("dev", "held-out", "espeak", "piper", "all")
PAUSE_S = 1.2  # the mid-sentence pause (as in the end-to-end bench)


@dataclass(frozen=True)
class Speaker:
    name: str
    synth: str  # "espeak" | "piper"
    voice: str = ""  # espeak: voice+variant
    words_per_minute: int = 160
    pitch: int = 50  # espeak's 0-99
    length_scale: float = 1.0  # piper
    noise_scale: float = 0.667
    noise_w_scale: float = 0.8
    shift_cents: int = 0  # sox pitch shift after synthesis (formants move with it)
    part: str = "dev"  # "dev" | "held-out"


def _espeak(voice: str, wpm: int, pitch: int, shift: int = 0) -> Speaker:
    return Speaker(f"espeak:{voice}:{wpm}:{pitch}" + (f":{shift:+d}c" if shift else ""), "espeak", voice=voice,
                   words_per_minute=wpm, pitch=pitch, shift_cents=shift)


def _piper(length: float, noise: float, noise_w: float, shift: int) -> Speaker:
    return Speaker(f"piper:joe:l{length}:n{noise}:{shift:+d}c", "piper", length_scale=length, noise_scale=noise,
                   noise_w_scale=noise_w, shift_cents=shift)


_ESPEAK = (_espeak("en-us+m1", 160, 50), _espeak("en-us+f2", 170, 65), _espeak("en-gb+m3", 150, 45),
           _espeak("en-gb+f3", 175, 70), _espeak("en-gb-scotland+m2", 155, 40),
           _espeak("en-gb-scotland+f1", 165, 60), _espeak("en-gb-x-rp+m4", 145, 55),
           _espeak("en-gb-x-rp+f4", 180, 75), _espeak("en-029+m5", 150, 50), _espeak("en-029+f5", 160, 68),
           _espeak("en-gb-x-gbclan+m6", 170, 35), _espeak("en-gb-x-gbcwmd+m7", 140, 45),
           _espeak("en-us-nyc+f1", 185, 62), _espeak("en-us-nyc+m2", 165, 48),
           _espeak("en-us+klatt", 155, 50, -200), _espeak("en-gb+croak", 150, 40, 300))
_PIPER = (_piper(0.8, 0.667, 0.8, 0), _piper(0.9, 0.33, 0.5, -300), _piper(1.0, 0.9, 1.0, 400),
          _piper(1.15, 0.667, 0.8, -150), _piper(1.3, 0.5, 0.6, 200), _piper(0.85, 0.8, 0.9, 500),
          _piper(1.05, 0.4, 0.7, -450), _piper(1.2, 0.75, 1.0, 0), _piper(0.95, 0.6, 0.8, 250),
          _piper(1.1, 0.9, 0.5, -250), _piper(0.9, 0.7, 1.0, 650), _piper(1.25, 0.3, 0.6, -600))


def _parted(speakers: tuple[Speaker, ...]) -> tuple[Speaker, ...]:
    from dataclasses import replace
    return tuple(replace(s, part="dev" if i % 2 == 0 else "held-out") for i, s in enumerate(speakers))


SPEAKERS: tuple[Speaker, ...] = _parted(_ESPEAK) + _parted(_PIPER)

# -- variants ------------------------------------------------------------------------------------
# backchannel form -> the text a synthesiser reads for it (spelled so that it sounds so)
BACKCHANNELS: dict[str, str] = {
    "uh-huh": "uh-huh", "mm-hmm": "mm hmm", "mhm": "mhm", "yeah": "yeah", "yep": "yep", "okay": "okay",
    "right": "right", "sure": "sure", "i see": "I see", "oh": "oh", "wow": "wow", "hmm": "hmm",
    "uh-huh x2": "uh-huh, uh-huh", "yeah x2": "yeah yeah", "okay x2": "okay, okay", "mm-hmm x2": "mm hmm, mm hmm",
}
NOISES = ("cough", "sneeze", "knock", "door slam", "clicks", "keyboard", "breath", "laughter", "music/tv")
INTERRUPTIONS: dict[str, str] = {
    "wait": "Wait.", "stop": "Stop.", "no, I said": "No, I said a large one.",
    "hold on": "Hold on a second.", "ask else": "Sorry, can I ask something else instead?",
    "correction": "Actually, make that a medium.", "question": "What time do you close today?",
    "change": "Can I change my order?", "excuse me": "Excuse me, that is not right.",
    "a name": "My name is Priya Raman.", "not mango": "No no, not mango, taro.",
    "hang on": "Hang on, I need to check something.",
}
# pause position -> (the words before the pause, the words after it): one sentence, read as one
PAUSES: dict[str, tuple[str, str]] = {
    "after a": ("I would like to order a", "large mango tea with pearls please."),
    "after and": ("I want a medium taro tea and", "a small green tea please."),
    "after um": ("Can I get a large, um,", "mango slush with extra ice?"),
    "after a number": ("I would like two", "large milk teas with pearls please."),
    "after a clause": ("I would like a large milk tea", "with tapioca pearls please."),
    "after the": ("Could you tell me the", "price of the mango tea?"),
    "after to": ("I was hoping to", "pick it up at six."),
    "after with": ("A small green tea with", "oat milk and no sugar."),
    "after a clause 2": ("That sounds good", "but can I add some grass jelly?"),
}
# complete turns (the pause after them is the end): the smooth-turn category, and the pause
# classifier's other class
SMOOTH: dict[str, str] = {
    "order": "I would like to order a large mango tea with pearls please.",
    "two teas": "I want a medium taro tea and a small green tea please.",
    "price": "Could you tell me the price of the mango tea?",
    "pickup": "I was hoping to pick it up at six.",
    "menu": "Could you tell me a little about your menu today?",
    "thanks": "Okay, thank you very much.",
    "yes": "Yes, that is right.",
    "toppings": "What toppings do you have?",
    "milk": "A small green tea with oat milk and no sugar.",
}


def variants(category: str) -> tuple[str, ...]:
    table: dict[str, tuple[str, ...]] = {
        "pause": tuple(PAUSES), "backchannel": tuple(BACKCHANNELS), "noise": NOISES,
        "interruption": tuple(INTERRUPTIONS), "smooth": tuple(SMOOTH)}
    return table[category]


def sentence_of(category: str, variant: str) -> str:
    """The sentence a pause or complete-turn variant says: a pause's words before and after it read
    as one, so a pause position and the complete turn that is its sentence share one (the unit a
    reading of words is held out by: ``folds.py``)."""
    if category == "pause":
        before, after = PAUSES[variant]
        return f"{before} {after}"
    if category == "smooth":
        return SMOOTH[variant]
    raise ValueError(f"a {category} clip says no sentence of a turn")


def speakers_of(split: str) -> tuple[Speaker, ...]:
    """The speakers of ``split`` (``dev``, ``held-out``, ``espeak``, ``piper`` or ``all``)."""
    if split not in SPLITS:
        raise ValueError(f"unknown corpus split {split!r}: one of {', '.join(SPLITS)}")
    if split == "all":
        return SPEAKERS
    if split in ("espeak", "piper"):
        return tuple(s for s in SPEAKERS if s.synth == split)
    return tuple(s for s in SPEAKERS if s.part == split)


@dataclass(frozen=True)
class Clip:
    """One speaker's rendering of one variant under one condition."""

    category: str
    variant: str
    condition: str
    speaker: Speaker

    @property
    def key(self) -> str:
        return f"{self.category}|{self.variant}|{self.condition}|{self.speaker.name}"


def conditions_of(speaker_index: int, variant_index: int, full: bool) -> tuple[str, ...]:
    """The conditions a speaker renders a variant under: all (``full``), or clean and two of the
    other four in rotation, so every cell has half the speakers of each part (the default: half
    the compute)."""
    if full:
        return CONDITIONS
    others = CONDITIONS[1:]
    at = (speaker_index // 2 + variant_index) % 2  # speakers alternate between the parts
    return ("clean", others[at], others[at + 2])


def clips(split: str, full: bool = False, categories: tuple[str, ...] = CATEGORIES) -> list[Clip]:
    chosen = speakers_of(split)
    out = []
    for index, speaker in enumerate(SPEAKERS):
        if speaker not in chosen:
            continue
        for category in categories:
            for v, variant in enumerate(variants(category)):
                out += [Clip(category, variant, condition, speaker) for condition in conditions_of(index, v, full)]
    return out
