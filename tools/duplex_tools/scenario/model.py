"""A scenario: one caller's timeline (utterances, pauses, noise, triggers on the agent's speech)
and what the agent is expected to do, loaded from YAML.

    name: barge-in-mid
    steps:
      - say: Could you tell me what time it is
        expect: {reply: true, max_ttfb_ms: 2000}
      - say: Wait, stop.
        at: {agent_heard_s: 2.5}          # once 2.5 s of the reply was heard
        expect: {interrupts: true, max_stop_ms: 300, reply: true}

Each step is one of ``say`` (text spoken with espeak-ng), ``wav`` (a file), ``noise`` (seconds of
a noise burst) or ``pause`` (seconds of silence); the steps play back to back unless ``at``
holds one back until something happens on the agent's side.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

PIPER = "piper"  # a step's voice: the local pipeline's Piper voice (needs setup.sh --local), not espeak-ng


class ScenarioError(ValueError):
    """A scenario file that cannot run; the message names the file and the key."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Trigger(_Strict):
    """When a step starts (exactly one): after this much agent audio of the current reply was
    heard; once the agent has finished speaking (the session went back to idle after the
    previous step began); or after a plain delay."""

    agent_heard_s: float | None = Field(None, ge=0)
    agent_done: bool = False
    after_s: float | None = Field(None, ge=0)
    timeout_s: float = Field(30.0, gt=0)  # the trigger must happen within this

    @model_validator(mode="after")
    def _one(self) -> Trigger:
        chosen = [self.agent_heard_s is not None, self.agent_done, self.after_s is not None]
        if sum(chosen) != 1:
            raise ValueError("at: give exactly one of agent_heard_s, agent_done, after_s")
        return self


class StepExpect(_Strict):
    """What the agent must do about this step. Unset fields are measured, not judged."""

    reply: bool | None = None  # True: the agent answers it; False: no response before the next step
    interrupts: bool | None = None  # True: a barge-in that silences the agent; False: the agent talks on
    max_ttfb_ms: float | None = Field(None, gt=0)  # end of this speech -> first agent audio heard
    min_ttfb_ms: float | None = Field(None, ge=0)
    max_stop_ms: float | None = Field(None, gt=0)  # speech onset -> agent audio silent at the client
    max_resume_ms: float | None = Field(None, gt=0)  # a sound that is not a turn ends -> the agent heard again

    @model_validator(mode="after")
    def _consistent(self) -> StepExpect:
        if (self.max_ttfb_ms is not None or self.min_ttfb_ms is not None) and self.reply is not True:
            raise ValueError("max_ttfb_ms/min_ttfb_ms need reply: true")
        if self.max_stop_ms is not None and self.interrupts is not True:
            raise ValueError("max_stop_ms needs interrupts: true")
        if self.max_resume_ms is not None and self.interrupts is not False:
            raise ValueError("max_resume_ms needs interrupts: false")
        return self


class Step(_Strict):
    say: str | None = Field(None, min_length=1)
    wav: str | None = None  # relative to the scenario file
    noise: float | None = Field(None, gt=0, le=10)  # seconds
    pause: float | None = Field(None, gt=0, le=60)  # seconds of silence
    noise_kind: Literal["white", "cough"] = "white"
    level: float = Field(1.0, gt=0, le=4)  # gain on speech and WAVs; RMS of noise is 0.3 * level
    voice: str = "en-us"  # espeak-ng voice, or "piper" (the local pipeline's Piper voice)
    # The sentence goes on in the next ``say`` step (after a pause between): the voice reads both
    # as one sentence, cut at the join, so this part ends as a sentence not finished sounds (a
    # fragment read alone ends falling, as if it were complete). Piper only (it says where words end).
    goes_on: bool = False
    words_per_minute: int = Field(165, ge=80, le=450)
    label: str | None = None
    at: Trigger | None = None
    expect: StepExpect = Field(default_factory=StepExpect)

    @model_validator(mode="after")
    def _one_action(self) -> Step:
        actions = [name for name in ("say", "wav", "noise", "pause") if getattr(self, name) is not None]
        if len(actions) != 1:
            raise ValueError(f"a step needs exactly one of say, wav, noise, pause (got {actions or 'none'})")
        if self.pause is not None and (self.expect.reply or self.expect.interrupts):
            raise ValueError("a pause cannot be expected to get a reply or to interrupt")
        if self.goes_on and (self.say is None or self.voice != PIPER):
            raise ValueError(f"goes_on needs a say step in the {PIPER} voice")
        return self

    @property
    def kind(self) -> str:
        return next(name for name in ("say", "wav", "noise", "pause") if getattr(self, name) is not None)

    @property
    def title(self) -> str:
        if self.label:
            return self.label
        if self.say is not None:
            return self.say
        if self.wav is not None:
            return Path(self.wav).name
        if self.noise is not None:
            return f"{self.noise_kind} noise {self.noise:g} s"
        return f"pause {self.pause:g} s"


class ScenarioExpect(_Strict):
    max_false_interruptions: int | None = Field(0, ge=0)  # responses cut by what should not cut them
    responses: int | None = Field(None, ge=0)  # exactly this many responses were started
    min_echo_gated_frames: int | None = Field(None, ge=0)  # the server set the agent's own echo aside
    idle_at_end: bool = True  # every stage holds nothing once the conversation is over
    abort_free_ms: float = Field(1000.0, gt=0)  # an aborted response leaves every stage within this
    no_errors: bool = True  # no `error` events from the server


class Scenario(_Strict):
    name: str
    description: str = ""
    tags: list[str] = Field(default_factory=list)
    # Why this scenario is expected to fail for now: it runs and is judged as usual, a failure
    # does not fail the run, and a pass is flagged so the mark gets removed.
    known_issue: str | None = None
    session: dict | None = None  # Realtime session settings sent with the offer
    echo_gain: float = Field(0.0, ge=0, le=1)  # the agent's audio fed back into the microphone
    # When the caller hangs up: ``quiet``, once the conversation is over (every reply played out,
    # every stage checked empty before the hang-up); ``judged``, as soon as the last step's outcome
    # is known (its window for a cut closed, or the first audio of its reply heard): the rest of
    # the reply's playout is not waited for, and every stage is checked empty after the hang-up.
    hang_up: Literal["quiet", "judged"] = "quiet"
    steps: list[Step] = Field(min_length=1)
    expect: ScenarioExpect = Field(default_factory=ScenarioExpect)
    source: Path | None = Field(None, exclude=True)

    @model_validator(mode="after")
    def _sentences_go_on(self) -> Scenario:
        says = [step for step in self.steps if step.say is not None]
        for at, step in enumerate(says):
            after = says[at + 1] if at + 1 < len(says) else None
            if step.goes_on and (after is None or after.voice != PIPER):
                raise ValueError(f"goes_on: {step.say!r} needs a later say step in the {PIPER} voice to go on in")
        return self

    def wav_path(self, step: Step) -> Path:
        assert step.wav is not None
        path = Path(step.wav).expanduser()
        if not path.is_absolute() and self.source is not None:
            path = self.source.parent / path
        return path


def load_scenario(path: str | Path) -> Scenario:
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ScenarioError(f"{path}: cannot read: {exc}") from None
    if not isinstance(raw, dict):
        raise ScenarioError(f"{path}: the top level must be a mapping")
    raw.setdefault("name", path.stem)
    try:
        scenario = Scenario.model_validate({**raw, "source": path})
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in err['loc']) or '(top)'}: {err['msg']}" for err in exc.errors())
        raise ScenarioError(f"{path}: {problems}") from None
    for step in scenario.steps:
        if step.wav is not None and not scenario.wav_path(step).is_file():
            raise ScenarioError(f"{path}: wav file not found: {scenario.wav_path(step)}")
    return scenario


def find_scenarios(paths: list[str | Path], tags: list[str] | None = None) -> list[Scenario]:
    """Scenario files from files and folders (``*.yaml`` inside, sorted); only those carrying
    every tag in ``tags`` if given."""
    files: list[Path] = []
    for entry in paths:
        entry = Path(entry)
        if entry.is_dir():
            files.extend(sorted(entry.glob("*.yaml")))
        elif entry.exists():
            files.append(entry)
        else:
            raise ScenarioError(f"{entry}: no such file or folder")
    scenarios = [load_scenario(f) for f in files]
    if tags:
        scenarios = [s for s in scenarios if set(tags) <= set(s.tags)]
    if not scenarios:
        raise ScenarioError(f"no scenarios in {', '.join(map(str, paths))}" + (f" with tags {tags}" if tags else ""))
    names = [s.name for s in scenarios]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ScenarioError(f"duplicate scenario names: {duplicates}")
    return scenarios
