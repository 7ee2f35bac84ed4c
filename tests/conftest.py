import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


import pytest

from duplex.edge.webrtc.rtc_options import use_loopback_candidates


@pytest.fixture
def loopback_candidates():
    """WebRTC tests talk over 127.0.0.1, which aioice does not offer by itself."""
    use_loopback_candidates(True)
    yield
    use_loopback_candidates(False)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failing test that served something shows what the server (and the engine) last said:
    a CI log is all there is of a failure on a machine nobody can open afterwards."""
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed:
        return
    from duplex_tools.harness import ServerProcess
    from duplex_tools.vllm import VLLMServer
    for name, value in getattr(item, "funcargs", {}).items():
        if isinstance(value, ServerProcess) and value.output:
            report.sections.append((f"duplex serve ({name}): last output", "".join(value.output[-60:])))
        elif isinstance(value, VLLMServer):
            report.sections.append((f"vLLM ({name}): last log", value.log_tail(60)))
