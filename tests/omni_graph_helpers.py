"""Drive the qwen3_omni talker and thinker runners step by step with the same inputs for any two
runners built on one module, on any device: for comparing their step paths (eager, static, graphs)."""

from __future__ import annotations

import time

import numpy as np
import torch


def _prefix(runner, thinker_hidden: int, n_user: int, seed: int):
    from duplex.models.qwen3_omni.payloads import TalkerPrefix

    g = torch.Generator().manual_seed(seed)

    def rnd(*shape):
        return (0.02 * torch.randn(*shape, generator=g)).to(runner.device, runner.dtype)

    return TalkerPrefix(user_embeds=rnd(n_user, thinker_hidden), user_hidden=rnd(n_user, thinker_hidden),
                        user_mm=torch.arange(n_user) % 2 == 0, assistant_embeds=rnd(3, thinker_hidden),
                        tts_embeds=rnd(3, thinker_hidden))


def reset(*runners) -> None:
    for runner in runners:
        for slot in list(runner.rows):
            runner.close(slot)


def drive(runner, rows: int, steps: int) -> tuple[np.ndarray, torch.Tensor, list[float]]:
    """Open ``rows`` requests in slots 0..rows-1 and step them all ``steps`` decode steps after the
    prefill; returns the frames (steps + 1, rows, 16), the rows' feedback and each decode step's
    wall time (synchronized on a GPU)."""
    from duplex.models.qwen3_omni.payloads import TextToken, ThinkerStep
    from duplex.runtime.contract import TurnRequest

    hidden = runner.tcfg.thinker_hidden_size
    request = TurnRequest(session_id="g", options={"talker_max_new_tokens": steps + 1})
    g = torch.Generator().manual_seed(7)
    for slot in range(rows):
        runner.open(slot, f"r{slot}", request)
        texts = (0.02 * torch.randn(steps + 2, hidden, generator=g)).to(runner.device, runner.dtype)
        step = ThinkerStep(TextToken("x", token_ids=[1]), texts, _prefix(runner, hidden, 5 + slot, slot))
        runner.feed(slot, "thinker", step, False)
    frames, times = [], []
    for _ in range(steps + 1):
        plan = runner.plan(list(range(rows)))
        _sync(runner.device)
        start = time.perf_counter()
        raw = runner.compute(plan)
        _sync(runner.device)
        times.append(time.perf_counter() - start)
        frames.append(raw["frames"])
    return np.stack(frames), runner.feedback[:rows].float().clone(), times[1:]


def _sync(device: str) -> None:
    if str(device).startswith("cuda"):
        torch.cuda.synchronize(device)


def thinker_pair(model_dir, device: str, graphs):
    """Two thinker runners on one tiny thinker (eager, and with ``graphs``) and an encoder."""
    from duplex.models.qwen3_omni.encoder import StreamingAudioEncoder
    from duplex.models.qwen3_omni.loading import load_audio_encoder, load_thinker, special_tokens
    from duplex.models.qwen3_omni.thinker import ThinkerRunner

    lm, config = load_thinker(model_dir, device)
    encoder = StreamingAudioEncoder(load_audio_encoder(model_dir, device)[0], device)

    def make(g):
        return ThinkerRunner(lm, config, special_tokens(config), memory_bytes=None, max_len=128, max_slots=6,
                             system_ids=[11, 12], ignore_eos=True, device=device, graphs=g)

    return make(False), make(graphs), encoder


def assert_same_thinking(eager, other, encoder, rows: int = 5, tokens: int = 9) -> None:
    """Both runners, fed the same turns in batches of every size (5 split 4 + 1, 3 padded to 4),
    give the same tokens and the same talker prefix (accept-layer hidden states)."""
    from duplex.models.qwen3_omni.payloads import AudioEmbeds
    from duplex.runtime.contract import TurnRequest

    seen, prefixes = {}, {}
    for runner in (eager, other):
        for slot in range(rows):
            runner.open(slot, f"r{slot}", TurnRequest(session_id="s", max_new_tokens=tokens))
            audio = (0.1 * np.random.default_rng(slot).standard_normal(8000 + 2000 * slot)).astype(np.float32)
            runner.feed(slot, "encoder", AudioEmbeds(encoder.encode_whole(audio)), True)
        out: dict[int, list[int]] = {slot: [] for slot in range(rows)}
        for step in range(4 * tokens):
            ready = [slot for slot in range(rows) if slot in runner.rows and runner.ready(slot)]
            if not ready:
                break
            plan = runner.plan(ready[-3:] if step % 2 else ready)  # vary the batch sizes
            for slot, result in runner.resolve(plan, runner.compute(plan)).items():
                data = (result.emits or [result.final])[0]
                out[slot] += data.token.token_ids
                if data.talker_prefix is not None:
                    prefixes[(runner is other, slot)] = data.talker_prefix
                if result.done:
                    runner.close(slot)
        seen[runner is other] = out
    assert seen[True] == seen[False]
    assert all(len(t) == tokens for t in seen[True].values())
    for slot in range(rows):
        ours, theirs = prefixes[(True, slot)], prefixes[(False, slot)]
        torch.testing.assert_close(ours.user_hidden.float(), theirs.user_hidden.float(), atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(ours.user_embeds.float(), theirs.user_embeds.float())
