"""``duplex bench turn-taking --corpus PART --folds sentence``: does the pause reading hear sentences
it never read? Held out by speaker alone, every sentence of the judged part was also said by the
training part's speakers, so a reading of words could have learned the sentences, not turns. Here
each sentence of PART is judged by a reading trained on the training part's pauses without that
sentence (its threshold picked the same way, ``train.pick_threshold``), beside one trained on every
sentence and today's rules. A pause position and the complete turn that says the same sentence are
one sentence (``spec.sentence_of``): neither teaches the other's fold."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from duplex.session.turn_model import PAUSE_FEATURES
from duplex_tools.report import table
from duplex_tools.turn_corpus.evaluate import JudgedPause
from duplex_tools.turn_corpus.train import fit, pick_threshold

RULES = "today's rules"
WITHOUT = "trained without the sentence"
EVERY = "trained on every sentence"
WAYS = (RULES, WITHOUT, EVERY)


@dataclass
class Tally:
    """One way's verdicts on one sentence's judged pauses."""

    opens: int = 0
    opens_ended: int = 0  # a pause the caller went on after, taken as the turn's end
    completes: int = 0
    completes_ended: int = 0  # the end of the turn, ended at its first judgement (else it waits for silence)

    def add(self, pause: JudgedPause, ends: bool) -> None:
        if pause.label == "open":
            self.opens, self.opens_ended = self.opens + 1, self.opens_ended + ends
        else:
            self.completes, self.completes_ended = self.completes + 1, self.completes_ended + ends

    def __iadd__(self, other: Tally) -> Tally:
        self.opens += other.opens
        self.opens_ended += other.opens_ended
        self.completes += other.completes
        self.completes_ended += other.completes_ended
        return self

    def rates(self) -> dict[str, float | int | None]:
        return {"opens": self.opens, "opens_ended": _share(self.opens_ended, self.opens),
                "completes": self.completes, "completes_ended": _share(self.completes_ended, self.completes)}


def _share(part: int, whole: int) -> float | None:
    return part / whole if whole else None


def reading(pauses: list[JudgedPause]) -> Callable[[JudgedPause], bool]:
    """The pause reading trained on ``pauses`` as ``train.train`` makes it: does it end the turn?"""
    rows = [(p.features, p.label) for p in pauses]
    model = fit(rows, PAUSE_FEATURES)
    complete_at = pick_threshold(model, rows)
    return lambda pause: model.probabilities(pause.features)["complete"] >= complete_at


def sentence_folds(training: list[JudgedPause], judged: list[JudgedPause]) -> dict[str, dict[str, Tally]]:
    """For each sentence of ``judged``: each way's tally of its pauses (``WAYS``)."""
    every = reading(training)
    folds: dict[str, dict[str, Tally]] = {}
    for sentence in sorted({p.sentence for p in judged}):
        without = reading([p for p in training if p.sentence != sentence])
        tallies = {way: Tally() for way in WAYS}
        for pause in (p for p in judged if p.sentence == sentence):
            tallies[RULES].add(pause, pause.rules_end)
            tallies[WITHOUT].add(pause, without(pause))
            tallies[EVERY].add(pause, every(pause))
        folds[sentence] = tallies
    return folds


def print_folds(folds: dict[str, dict[str, Tally]]) -> dict[str, object]:
    """The table of ``folds`` with the totals last; returned as the JSON report."""
    totals = {way: Tally() for way in WAYS}
    rows = []
    for sentence, tallies in folds.items():
        for way in WAYS:
            totals[way] += tallies[way]
        rows.append(_row(sentence, tallies))
    rows.append(_row("all sentences", totals))
    headers = ["sentence", "open", "complete"]
    for way in WAYS:
        headers += [f"{way}: opens ended", "completes ended"]
    print("Pauses by sentence: the share of pauses the caller went on after that each way ended, and of "
          "complete turns it ended at their first judgement (the rest wait for the longest pause)")
    print(table(headers, rows))
    return {"sentences": {s: {way: t.rates() for way, t in tallies.items()} for s, tallies in folds.items()},
            "totals": {way: t.rates() for way, t in totals.items()}}


def _row(sentence: str, tallies: dict[str, Tally]) -> list[object]:
    first = tallies[RULES]
    row: list[object] = [sentence[:44], first.opens, first.completes]
    for way in WAYS:
        rates = tallies[way].rates()
        row += ["-" if rates["opens_ended"] is None else rates["opens_ended"],
                "-" if rates["completes_ended"] is None else rates["completes_ended"]]
    return row
