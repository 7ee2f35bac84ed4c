"""`duplex bench amd`: answering-machine detection (duplex/edge/phone/amd.py) scored on generated
greetings, tuned on some voices and wordings and scored on others.

Each greeting is what the callee's side sends once the call is answered: a random pause (the
callee picking up), then a person's short greeting and the silence of them waiting ("hello?",
"yes, who is this?"), or a machine's long one, a pause and a beep (a steady tone of 0.9-2 kHz,
0.2-0.8 s) and silence. Speech is espeak-ng (several voices) or Piper; every clip is taken to
8 kHz, through G.711 and back, with a little line noise, and fed in 20 ms frames, as a SIP call
would deliver it. Printed per split (tune: the voices and wordings the thresholds were set on;
test: the others): accuracy, decision time (mean, max; the limit is 3 s), and for machines how
many beeps were found and how far their found end was from the true one.
"""

from __future__ import annotations

import argparse
import random
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from duplex.audio import resample
from duplex.edge.media import g711
from duplex.edge.phone.amd import AmdVerdict, AnsweringMachineDetector
from duplex_tools.report import table, write_json

RATE = 8000
PIPER = "piper"
TUNE_VOICES = ["en-us", "en-gb", "en-us+f3"]
TEST_VOICES = ["en-gb-scotland", "en-029", "en-gb-x-rp+f2", "en-us-nyc+m3", PIPER]
HUMAN = {
    "tune": ["hello?", "yes, who is this?", "hi, this is Sam.", "hello, who's calling?"],
    "test": ["yeah, hello?", "good morning, Dana speaking.", "hi there.", "hello, yes?", "speaking.",
             "hey, what's up?"],
}
MACHINE = {
    "tune": ["Hi, you have reached the Smith residence. We can't come to the phone right now, please leave a "
             "message after the tone.",
             "The person you are calling is not available. Please leave your message after the beep.",
             "Hello, you've reached Chris. I'm not available at the moment, so leave me a message."],
    "test": ["Thank you for calling Riverside Dental. Our office is currently closed. Please leave a message "
             "after the tone.",
             "Hey, it's Jordan. Sorry I missed your call, leave your name and number and I'll get back to you.",
             "You have reached the voicemail of Alex Morgan. Please record your message after the tone.",
             "The number you have dialed is not available right now. At the tone, please record your message."],
}
SPLIT_VOICES = {"tune": TUNE_VOICES, "test": TEST_VOICES}


@dataclass(frozen=True)
class Greeting:
    voice: str
    text: str
    machine: bool
    audio: np.ndarray  # int16 at 8 kHz
    beep_end_ms: int | None  # where the beep ends in ``audio`` (machines)


@dataclass(frozen=True)
class Scored:
    greeting: Greeting
    verdict: AmdVerdict
    decided_ms: int
    beep_end_ms: int | None

    @property
    def correct(self) -> bool:
        return (self.verdict is AmdVerdict.MACHINE) == self.greeting.machine


@lru_cache(maxsize=256)
def speech(text: str, voice: str) -> np.ndarray:
    """float32 at 8 kHz."""
    if voice == PIPER:
        from duplex.models.local.assets import piper_voice_paths
        from duplex.models.local.tts import PiperSynth

        synth = PiperSynth(*piper_voice_paths(), noise_scale=0.0, noise_w_scale=0.0)
        return resample(synth.synthesize(text), synth.sample_rate, RATE).astype(np.float32)
    from duplex_tools.harness import espeak

    return espeak(text, rate=RATE, voice=voice)


def greeting(voice: str, text: str, machine: bool, seed: int) -> Greeting:
    rng = random.Random(f"{voice}|{text}|{seed}")
    words = speech(text, voice)
    words = words / max(float(np.abs(words).max()), 1e-6) * rng.uniform(0.3, 0.8)
    parts: list[np.ndarray] = [np.zeros(int(RATE * rng.uniform(0.15, 0.8)), np.float32), words]
    beep_end = None
    if machine:
        parts.append(np.zeros(int(RATE * rng.uniform(0.2, 0.6)), np.float32))
        seconds, hz = rng.uniform(0.2, 0.8), rng.choice([1000.0, 1200.0, 1400.0, 1850.0])
        t = np.arange(int(RATE * seconds)) / RATE
        parts.append((rng.uniform(0.2, 0.5) * np.sin(2 * np.pi * hz * t)).astype(np.float32))
        beep_end = 1000 * sum(len(p) for p in parts) // RATE
    parts.append(np.zeros(RATE * 3, np.float32))  # silence: waiting for us, or recording
    audio = np.concatenate(parts)
    audio += np.random.default_rng(seed).normal(0, 10 ** (-60 / 20), len(audio)).astype(np.float32)
    line = g711.decode(g711.encode(g711.float_to_int16(audio), "PCMU"), "PCMU")  # through the phone line
    return Greeting(voice, text, machine, line.astype(np.int16), beep_end)


def corpus(split: str, seeds: int = 1) -> list[Greeting]:
    out = []
    for voice in SPLIT_VOICES[split]:
        for seed in range(seeds):
            out += [greeting(voice, text, False, seed) for text in HUMAN[split]]
            out += [greeting(voice, text, True, seed) for text in MACHINE[split]]
    return out


def score(item: Greeting) -> Scored:
    detector = AnsweringMachineDetector(RATE)
    decision = None
    for start in range(0, len(item.audio), 160):
        decision = detector.feed(item.audio[start:start + 160]) or decision
    assert detector.decision is not None  # the whole clip is longer than the deadline
    return Scored(item, detector.decision.verdict, detector.decision.decided_ms, detector.beep_end_ms)


def summary(results: list[Scored]) -> dict:
    machines = [r for r in results if r.greeting.machine]
    beeps = [r for r in machines if r.beep_end_ms is not None]
    off = [abs((r.beep_end_ms or 0) - (r.greeting.beep_end_ms or 0)) for r in beeps]
    return {"clips": len(results), "accuracy": sum(r.correct for r in results) / max(len(results), 1),
            "human_ok": sum(r.correct for r in results if not r.greeting.machine),
            "humans": len(results) - len(machines), "machine_ok": sum(r.correct for r in machines),
            "machines": len(machines),
            "decided_mean_ms": float(np.mean([r.decided_ms for r in results])) if results else 0.0,
            "decided_max_ms": max((r.decided_ms for r in results), default=0),
            "beeps_found": len(beeps), "beep_end_off_max_ms": max(off, default=0)}


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("amd", help="answering-machine detection scored on generated greetings")
    parser.add_argument("--split", choices=["tune", "test", "both"], default="both")
    parser.add_argument("--seeds", type=int, default=2, help="variants (pause, loudness, beep) per voice and wording")
    parser.add_argument("--errors", action="store_true", help="list the clips it got wrong")
    parser.add_argument("--json", dest="json_path", help="write results here")
    parser.set_defaults(func=run, takes_overrides=False)


def run(args: argparse.Namespace, overrides: list[str]) -> int:
    splits = ["tune", "test"] if args.split == "both" else [args.split]
    rows, payload = [], {}
    for split in splits:
        results = [score(item) for item in corpus(split, args.seeds)]
        found = summary(results)
        payload[split] = found
        rows.append([split, found["clips"], f"{found['accuracy']:.3f}", f"{found['human_ok']}/{found['humans']}",
                     f"{found['machine_ok']}/{found['machines']}", round(found["decided_mean_ms"]),
                     found["decided_max_ms"], f"{found['beeps_found']}/{found['machines']}",
                     found["beep_end_off_max_ms"]])
        if args.errors:
            for r in results:
                if not r.correct:
                    print(f"  wrong ({split}): {r.greeting.voice} {r.greeting.text[:50]!r} -> {r.verdict} "
                          f"at {r.decided_ms} ms")
    print(table(["split", "clips", "accuracy", "humans ok", "machines ok", "decided mean ms", "decided max ms",
                 "beeps found", "beep end off max ms"], rows))
    write_json(args.json_path, payload)
    return 0
