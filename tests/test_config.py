import subprocess
import sys

import pytest

from duplex.config import ConfigError, check_pipeline, load_pipeline, pipeline_from_dict
from duplex.config.loader import resolve_config_path
from duplex.config.session import SessionConfig
from duplex.models.registry import BUILDERS


def two_stages(**first) -> dict:
    return {"name": "t", "stages": [
        {"name": "a", "builder": "toy.split", "stream_to": ["b"], **first},
        {"name": "b", "builder": "toy.upper", "terminal": True, "scheduler": {"kind": "simple"}},
    ]}


def test_yaml_loads_with_dotted_overrides():
    cfg = load_pipeline("toy", ["--upper.max_batch_size", "4", "--split.threads=2",
                                             "--relay.credits_per_peer", "8"])
    assert cfg.stage("upper").scheduler.max_batch_size == 4
    assert cfg.stage("split").threads == 2
    assert cfg.relay.credits_per_peer == 8
    assert cfg.entry_stages == ["split"]
    assert cfg.upstreams("upper") == ["split"]


def test_named_config_resolves_to_the_bundled_file_and_a_path_still_works(tmp_path, monkeypatch):
    bundled = resolve_config_path("toy")
    assert bundled.is_file() and bundled.parent.name == "configs" and bundled.parent.parent.name == "duplex"
    own = tmp_path / "mine.yaml"
    own.write_text(bundled.read_text().replace("name: toy", "name: mine"))
    assert load_pipeline(own).name == "mine"
    monkeypatch.chdir(tmp_path)
    (tmp_path / "toy").mkdir()  # a folder of that name in the working directory does not shadow the name
    assert load_pipeline("toy").name == "toy"
    assert load_pipeline("mine.yaml").name == "mine"
    bundled_names = "engine, local, omni-real, omni-tiny, services, toy, toy-voice"
    with pytest.raises(ConfigError, match=f"bundled configs: {bundled_names}"):
        load_pipeline("no-such-pipeline")


@pytest.mark.parametrize("overrides, fragment", [
    (["--upper.bogus", "1"], "unknown key 'bogus' for stage 'upper'"),
    (["--nosuch", "1"], "unknown key nosuch"),
    (["--upper.max_batch_size", "0"], "stages[1] (upper).scheduler.max_batch_size"),
])
def test_bad_overrides_name_the_key(overrides, fragment):
    with pytest.raises(ConfigError) as err:
        load_pipeline("toy", overrides)
    assert fragment in str(err.value)


def test_unknown_key_in_yaml_is_named():
    with pytest.raises(ConfigError, match=r"unknown key stages\[0\] \(a\)\.colour"):
        pipeline_from_dict(two_stages(colour="red"))


@pytest.mark.parametrize("session, fragment", [
    ({"vad": {"silence_ms": 5}}, "session.vad.silence_ms: Input should be greater than or equal to 60"),
    ({"vad": {"silnce_ms": 500}}, "unknown key session.vad.silnce_ms"),
    ({"preemptive_generation": {"enabled": True, "pause_ms": 600}}, "session: preemptive_generation.pause_ms (600)"),
])
def test_the_session_block_is_checked_at_load(session, fragment):
    with pytest.raises(ConfigError) as err:
        pipeline_from_dict({**two_stages(), "session": session})
    assert fragment in str(err.value)


def test_the_session_block_loads_typed():
    cfg = pipeline_from_dict({**two_stages(), "session": {"turn_detection": "semantic_vad"}})
    assert isinstance(cfg.session, SessionConfig) and cfg.session.semantic_turns
    assert pipeline_from_dict(two_stages()).session == SessionConfig()


def test_dangling_edge_is_named():
    raw = two_stages()
    raw["stages"][1]["next"] = ["ghost"]
    with pytest.raises(ConfigError, match=r"stages\[1\]\.next: stage 'b' points to unknown stage 'ghost'"):
        pipeline_from_dict(raw)


def test_cycle_is_refused():
    raw = two_stages()
    raw["stages"].append({"name": "c", "builder": "toy.upper", "next": ["b"]})
    raw["stages"][1]["next"] = ["c"]
    with pytest.raises(ConfigError, match="cycle b -> c -> b"):
        pipeline_from_dict(raw)


def test_wait_for_needs_a_next_edge():
    raw = two_stages()
    raw["stages"][1]["wait_for"] = ["a"]
    with pytest.raises(ConfigError, match="waits for 'a', but 'a' does not list 'b' in next"):
        pipeline_from_dict(raw)


def test_unknown_builder_is_refused_before_start():
    cfg = pipeline_from_dict(two_stages(builder="toy.nothing"))
    with pytest.raises(ConfigError, match=r"stages\[0\] \(a\)\.builder: unknown builder 'toy.nothing'"):
        check_pipeline(cfg, BUILDERS)


def test_oversubscribed_device_names_device_stages_and_shares():
    cfg = pipeline_from_dict(two_stages(memory=0.7), {"b.memory": 0.4})
    with pytest.raises(ConfigError) as err:
        check_pipeline(cfg, BUILDERS)
    message = str(err.value)
    assert "device cpu" in message and "110%" in message and "a=70%" in message and "b=40%" in message


def test_bytes_budget_over_declared_device_size():
    cfg = pipeline_from_dict(two_stages(device="cuda:0", memory="60GiB"),
                             {"b.device": "cuda:0", "b.memory": "30GiB", "devices": {"cuda:0": "80GiB"}})
    with pytest.raises(ConfigError, match=r"device cuda:0 of 80.0 GiB is oversubscribed: budgets sum to 112%"):
        check_pipeline(cfg, BUILDERS)


def test_bytes_budget_on_a_gpu_of_unknown_size_waits_for_the_card():
    """Checked at start against the card's free memory (tests/test_device_placement.py)."""
    cfg = pipeline_from_dict(two_stages(device="cuda:1", memory="1GiB"), {"b.device": "cuda:1", "b.memory": 0.1})
    check_pipeline(cfg, BUILDERS)
    over = pipeline_from_dict(two_stages(device="cuda:1", memory="1GiB"), {"b.device": "cuda:1", "b.memory": 1.0,
                                                                             "a.memory": 0.2})
    with pytest.raises(ConfigError, match="budgets sum to 120%"):
        check_pipeline(over, BUILDERS)


def test_check_config_command(tmp_path):
    ok = subprocess.run([sys.executable, "-m", "duplex.cli", "check-config", "toy"],
                        capture_output=True, text=True, cwd=tmp_path, check=False)
    assert ok.returncode == 0, ok.stderr
    assert "ok: toy" in ok.stdout
    bad = subprocess.run([sys.executable, "-m", "duplex.cli", "check-config", "toy",
                          "--split.memory", "0.8", "--upper.memory", "0.3"],
                         capture_output=True, text=True, check=False)
    assert bad.returncode == 2
    assert "oversubscribed" in bad.stderr and "split=80%" in bad.stderr
