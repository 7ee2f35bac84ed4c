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
