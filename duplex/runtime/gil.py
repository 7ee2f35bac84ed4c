"""A shorter GIL switch interval for processes whose threads hand each other small pieces of
work: a scheduler's loop thread and its compute worker (``schedulers/ar.py``), the edge's event
loop and aiortc's Opus decoder threads and encoder pool. At the default 5 ms a thread that wants
the GIL may wait up to 5 ms per hand-off while another runs Python; 0.5 ms bounds that at a
negligible switching cost."""

from __future__ import annotations

import sys

GIL_SWITCH_S = 0.0005


def shorten_gil_switch() -> None:
    sys.setswitchinterval(min(sys.getswitchinterval(), GIL_SWITCH_S))
