"""qwen3_omni step by step, in one process: each streamed/batched piece equals transformers'
one-shot computation on the same tiny checkpoint, and the AR schedulers keep slots exact."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from duplex.config.pipeline import StageConfig
from duplex.models.qwen3_omni.code2wav import StreamingCode2Wav
from duplex.models.qwen3_omni.encoder import StreamingAudioEncoder
from duplex.models.qwen3_omni.loading import (
    load_audio_encoder,
    load_code2wav,
    load_config,
    load_talker,
    load_thinker,
    special_tokens,
)
from duplex.models.qwen3_omni.payloads import AudioEmbeds, CodecChunk, VocodedAudio
from duplex.models.qwen3_omni.talker import TalkerRunner
from duplex.models.qwen3_omni.thinker import ThinkerRunner
from duplex.models.qwen3_omni.tiny import init_tiny
from duplex.runtime.contract import CallerAudio, TurnRequest, WorkItem
from duplex.runtime.schedulers.ar import ARScheduler, FeedbackARScheduler
from duplex_tools.qwen3_omni.reference import Reference

torch.set_num_threads(1)
SYSTEM = [11, 12, 13, 14]


def tiny_dir(factory) -> Path:
    path = factory.getbasetemp() / "omni-tiny"
    if not (path / "model.safetensors").exists():
        init_tiny(path)
    return path


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return tiny_dir(tmp_path_factory)


@pytest.fixture(scope="module")
def reference(model_dir) -> Reference:
    return Reference(str(model_dir))


@pytest.fixture(scope="module")
def encoder(model_dir) -> StreamingAudioEncoder:
    return StreamingAudioEncoder(load_audio_encoder(model_dir)[0])


def speech_like(seconds: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (0.1 * rng.standard_normal(int(16000 * seconds))).astype(np.float32)


def item(rid: str, data, eos: bool, request=None, source="encoder") -> WorkItem:
    return WorkItem(rid, source, data, eos, request or TurnRequest(session_id=rid))


def tokens_request(thinker: int, talker: int | None = None) -> TurnRequest:
    """A turn whose thinker writes ``thinker`` tokens at most (and the talker ``talker`` frames)."""
    options = {} if talker is None else {"talker_max_new_tokens": talker}
    return TurnRequest(session_id="s", max_new_tokens=thinker, options=options)


def drain_until(scheduler, done: set, count: int, timeout: float = 60.0) -> dict[str, list]:
    out: dict[str, list] = {}
    deadline = time.monotonic() + timeout
    while len(done) < count:
        assert time.monotonic() < deadline, f"only {len(done)}/{count} requests ended"
        for emit in scheduler.outbox.drain():
            assert emit.error is None, emit.error
            out.setdefault(emit.request_id, []).append(emit)
            if emit.eos:
                done.add(emit.request_id)
        time.sleep(0.002)
    return out


def test_tiny_checkpoint_sets_the_fields_the_modelling_code_needs(model_dir, tmp_path):
    config = load_config(model_dir)
    assert config.talker_config.num_code_groups == config.code2wav_config.num_quantizers == 16
    assert config.talker_config.text_config.shared_expert_intermediate_size > 0
    assert config.thinker_config.vision_start_token_id is not None
    assert config.talker_config.text_config.vocab_size == config.code2wav_config.codebook_size + 1024
    for load in (load_audio_encoder, load_thinker, load_talker, load_code2wav):
        module, _ = load(model_dir)  # strict: a missing or stray tensor raises
        assert not module.training
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        (tmp_path / "config.json").write_text((model_dir / "config.json").read_text())
        load_thinker(tmp_path)


@pytest.mark.parametrize("samples", [9000, 33234, 80077])
def test_streamed_encoder_equals_the_one_shot_audio_tower(reference, encoder, samples):
    from transformers import WhisperFeatureExtractor

    audio = speech_like(samples / 16000, samples)
    features = WhisperFeatureExtractor(feature_size=128)(audio, sampling_rate=16000, return_attention_mask=True,
                                                         return_tensors="pt", padding="longest")
    with torch.no_grad():
        expected = reference.model.thinker.get_audio_features(
            features["input_features"], feature_attention_mask=features["attention_mask"]).last_hidden_state
    rng = np.random.default_rng(samples)
    state, pieces, pos = {}, [], 0
    while pos < samples:
        step = int(rng.integers(300, 6000))
        chunk, pos = audio[pos:pos + step], pos + step
        (produced,) = encoder([item("r", CallerAudio(chunk), pos >= samples, source="client")], [state])
        assert all(isinstance(p, AudioEmbeds) for p in produced)
        pieces += [p.embeds for p in produced]
        assert all(p.floor_moved == 0 for p in produced)
    streamed = torch.cat(pieces)
    assert streamed.shape == expected.shape
    assert torch.allclose(streamed, expected, atol=1e-5, rtol=1e-4)
    if samples > 2 * 32000:
        assert len(pieces) > 1  # a window shipped before the end of speech


def test_encoder_reports_windows_shipped_before_a_louder_part(encoder):
    quiet, loud = speech_like(2.5, 1) * 1e-5, speech_like(1.5, 2)
    audio = np.concatenate([quiet, loud])
    state, last = {}, None
    for start in range(0, len(audio), 8000):
        (produced,) = encoder([item("r", CallerAudio(audio[start:start + 8000]), start + 8000 >= len(audio))], [state])
        last = produced[-1] if produced else last
    assert last.floor_moved == 1  # the first 2 s window used the quiet part's floor


def test_code2wav_streams_chunks_equal_to_one_full_decode_batched_by_length(model_dir):
    vocoder = StreamingCode2Wav(load_code2wav(model_dir)[0])
    assert vocoder.holdback == 555
    rng = np.random.default_rng(0)
    codes = [torch.as_tensor(rng.integers(0, 256, (16, 40))) for _ in range(3)]
    states = [{} for _ in codes]
    streamed: list[list[np.ndarray]] = [[] for _ in codes]
    start = 0
    for size in [2, 6, 6, 6, 6, 6, 6, 2]:
        items = [item(f"r{i}", CodecChunk(c[:, start:start + size].numpy(), start=start), False, source="talker")
                 for i, c in enumerate(codes)]
        assert len({vocoder.batch_key(x) for x in items}) == 1  # one bucket: one batched forward
        for i, produced in enumerate(vocoder(items, states)):
            assert all(isinstance(p, VocodedAudio) for p in produced)
            streamed[i] += [p.samples for p in produced]
        start += size
    for i, c in enumerate(codes):
        full = vocoder.decode_full(c)
        got = np.concatenate(streamed[i])
        assert got.shape == full.shape == (40 * 1920 - 555,)
        assert np.linalg.norm(got - full) / np.linalg.norm(full) <= 1e-4
    with pytest.raises(ValueError, match="expected 40"):
        vocoder([item("r0", CodecChunk(codes[0][:, :2].numpy(), start=7), False)], [states[0]])


def _schedulers(model_dir, thinker_budget=None, slots=8):
    lm, config = load_thinker(model_dir)
    talker, _ = load_talker(model_dir)
    thinker_stage = StageConfig(name="thinker", builder="x", scheduler={"kind": "ar", "max_running_requests": slots})
    thinker = ARScheduler(thinker_stage,
                          ThinkerRunner(lm, config, special_tokens(config), memory_bytes=thinker_budget, max_len=256,
                                        system_ids=SYSTEM))
    speaker = FeedbackARScheduler(StageConfig(name="talker", builder="x", scheduler={"kind": "feedback_ar"}),
                                  TalkerRunner(talker, config, memory_bytes=None, max_len=512))
    return thinker, speaker


def test_thinker_and_talker_runners_match_generate_with_8_concurrent_requests(model_dir, reference, encoder):
    thinker, talker = _schedulers(model_dir)
    params = tokens_request(10, 24)
    audios = [speech_like(1.5 + 0.3 * i, i) for i in range(8)]
    expected = [reference.run(a, system_ids=SYSTEM, thinker_max_new_tokens=10, talker_max_new_tokens=24)
                for a in audios]
    thinker.start(), talker.start()
    try:
        for i, audio in enumerate(audios):
            embeds = encoder.encode_whole(audio)
            thinker.inbox.put(item(f"r{i}", AudioEmbeds(embeds[:7]), False, params))  # prefill while speaking
            thinker.inbox.put(item(f"r{i}", AudioEmbeds(embeds[7:]), True, params))
        tokens: dict[str, list[int]] = {}
        done: set = set()
        deadline = time.monotonic() + 60
        codes: dict[str, list] = {}
        while len(done) < 8:
            assert time.monotonic() < deadline
            for emit in thinker.outbox.drain():
                assert emit.error is None, emit.error
                tokens.setdefault(emit.request_id, []).extend(emit.data.token.token_ids)
                talker.inbox.put(item(emit.request_id, emit.data, emit.eos, params, source="thinker"))
            for emit in talker.outbox.drain():
                assert emit.error is None, emit.error
                if emit.data is not None:
                    codes.setdefault(emit.request_id, []).append(emit.data.codes)
                done |= {emit.request_id} if emit.eos else set()
            time.sleep(0.002)
        for i, ref in enumerate(expected):
            assert tokens[f"r{i}"] == ref.text_tokens
            assert np.array_equal(np.concatenate(codes[f"r{i}"], axis=1), ref.codes.numpy())
        assert thinker.resources()["kv_slots"] == 0 and talker.resources()["feedback_rows"] == 0
    finally:
        thinker.stop(), talker.stop()


class _RecordingThinker(ThinkerRunner):
    """The real runner, noting which request each planned row belongs to."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.planned: list[str] = []

    def plan(self, slots):
        self.planned += [self.rows[s].request_id for s in slots]
        return super().plan(slots)


def test_abort_mid_decode_frees_the_slot_once_and_the_row_is_never_stepped_again(model_dir, reference, encoder):
    lm, config = load_thinker(model_dir)
    runner = _RecordingThinker(lm, config, special_tokens(config), memory_bytes=None, max_len=256, system_ids=SYSTEM)
    sched = ARScheduler(StageConfig(name="thinker", builder="x", scheduler={"kind": "ar", "max_running_requests": 2}),
                        runner)
    sched.start()
    try:
        audio = speech_like(1.0, 7)
        embeds = encoder.encode_whole(audio)
        long = tokens_request(200)
        sched.inbox.put(item("victim", AudioEmbeds(embeds), True, long))
        deadline = time.monotonic() + 30
        seen = 0
        while seen < 3:
            assert time.monotonic() < deadline
            seen += sum(1 for e in sched.outbox.drain() if e.request_id == "victim")
            time.sleep(0.001)
        sched.abort("victim")
        sched.abort("victim")  # idempotent
        while sched.live_requests():
            assert time.monotonic() < deadline
            time.sleep(0.001)
        steps_after_free = runner.planned.count("victim")
        assert sched.resources()["kv_slots"] == 0 and not runner.rows
        # The freed slot is reused by a new request whose output equals generate().
        sched.inbox.put(item("next", AudioEmbeds(embeds), True, tokens_request(8)))
        emits = drain_until(sched, set(), 1)["next"]
        assert runner.planned.count("victim") == steps_after_free
        ref = reference.run(audio, system_ids=SYSTEM, thinker_max_new_tokens=8, talker_max_new_tokens=4)
        assert [t for e in emits for t in e.data.token.token_ids] == ref.text_tokens
    finally:
        sched.stop()


class _GatedThinker(ThinkerRunner):
    """The real runner; once armed, its next compute waits for the test to open the gate."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.gate: threading.Event | None = None
        self.entered = threading.Event()

    def compute(self, plan):
        gate, self.gate = self.gate, None
        if gate is not None:
            self.entered.set()
            assert gate.wait(timeout=60), "the test never opened the gate"
        return super().compute(plan)


def test_abort_frees_the_slot_while_its_step_is_in_flight_and_a_new_owner_still_matches_generate(
        model_dir, reference, encoder):
    lm, config = load_thinker(model_dir)
    runner = _GatedThinker(lm, config, special_tokens(config), memory_bytes=None, max_len=256, system_ids=SYSTEM)
    sched = ARScheduler(StageConfig(name="thinker", builder="x", scheduler={"kind": "ar", "max_running_requests": 1}),
                        runner)
    sched.start()
    gate = threading.Event()
    try:
        audio = speech_like(1.0, 8)
        embeds = encoder.encode_whole(audio)
        sched.inbox.put(item("victim", AudioEmbeds(embeds), True, tokens_request(200)))
        deadline = time.monotonic() + 30
        seen = 0
        while seen < 2:
            assert time.monotonic() < deadline
            seen += sum(1 for e in sched.outbox.drain() if e.request_id == "victim")
            time.sleep(0.001)
        runner.gate = gate
        assert runner.entered.wait(timeout=30)  # a step holding the victim's slot is computing now
        sched.abort("victim")
        while sched.live_requests() or sched.resources()["kv_slots"]:
            assert time.monotonic() < deadline, sched.resources()
            time.sleep(0.001)
        assert not gate.is_set() and not runner.rows  # freed before the step in flight resolved
        sched.outbox.drain()  # what the victim emitted before its abort was handled
        # The only slot goes to a new request at once; the old step resolves later, dropped.
        sched.inbox.put(item("next", AudioEmbeds(embeds), True, tokens_request(8)))
        while sched.resources()["kv_slots"] != 1:
            assert time.monotonic() < deadline
            time.sleep(0.001)
        gate.set()
        emits = drain_until(sched, set(), 1)
        assert set(emits) == {"next"}  # nothing of the victim left the stage after its abort
        ref = reference.run(audio, system_ids=SYSTEM, thinker_max_new_tokens=8, talker_max_new_tokens=4)
        assert [t for e in emits["next"] for t in e.data.token.token_ids] == ref.text_tokens
        assert sched.resources()["kv_slots"] == 0
    finally:
        gate.set()
        sched.stop()


def test_memory_budget_sizes_the_kv_slots_and_admission_waits_for_a_free_one(model_dir, encoder):
    lm, config = load_thinker(model_dir)
    text = config.thinker_config.text_config
    from duplex.runtime.contract import SlotKVCache

    per_slot = SlotKVCache.bytes_per_slot(text.num_hidden_layers, text.num_key_value_heads, text.head_dim, 256)
    with pytest.raises(ValueError, match="holds no KV slot"):
        ThinkerRunner(lm, config, special_tokens(config), memory_bytes=per_slot - 1, max_len=256)
    runner = ThinkerRunner(lm, config, special_tokens(config), memory_bytes=2 * per_slot + 5, max_len=256)
    assert runner.capacity == 2
    sched = ARScheduler(StageConfig(name="thinker", builder="x", scheduler={"kind": "ar"}), runner)
    embeds = encoder.encode_whole(speech_like(1.0, 3))
    # Inputs queue before the loop starts, so the first look at them sees all three requests.
    for i in range(3):
        sched.inbox.put(item(f"r{i}", AudioEmbeds(embeds), True, tokens_request(40)))
    sched.start()
    try:
        deadline = time.monotonic() + 30
        while sched.resources()["kv_slots"] < 2:
            assert time.monotonic() < deadline
            time.sleep(0.001)
        held = sched.resources()
        assert held["kv_slots"] == 2 and held["queued_items"] == 1  # the third waits for a slot
        drain_until(sched, set(), 3)
        assert sched.resources()["kv_slots"] == 0
    finally:
        sched.stop()


def test_bad_input_fails_only_its_request(model_dir, encoder):
    thinker, _ = _schedulers(model_dir)
    thinker.start()
    try:
        embeds = encoder.encode_whole(speech_like(1.0, 4))
        thinker.inbox.put(item("bad", AudioEmbeds(torch.zeros(3, 5)), True))
        thinker.inbox.put(item("good", AudioEmbeds(embeds), True, tokens_request(5)))
        out: dict[str, list] = {}
        deadline = time.monotonic() + 30
        while len(out.get("good", [])) < 5:
            assert time.monotonic() < deadline
            for emit in thinker.outbox.drain():
                out.setdefault(emit.request_id, []).append(emit)
            time.sleep(0.002)
        assert "audio_embeds must be (n, 64)" in out["bad"][0].error.message
        assert out["good"][-1].eos and all(e.error is None for e in out["good"])
        assert thinker.resources()["kv_slots"] == 0
    finally:
        thinker.stop()
