"""A self-pipe: any thread wakes a poll loop (``zmq.Poller``, ``select``) by writing one byte.

Queues that other threads fill (scheduler outboxes, relay releases, held progress reports) each
own one; the stage host's I/O loop polls its ``fd`` beside the sockets.
"""

from __future__ import annotations

import os


class WakePipe:
    def __init__(self) -> None:
        self.fd, self._write_fd = os.pipe()
        os.set_blocking(self.fd, False)
        os.set_blocking(self._write_fd, False)

    def wake(self) -> None:
        try:
            os.write(self._write_fd, b"\0")
        except (BlockingIOError, OSError):
            pass  # full of wake-ups already (the reader drains everything), or closed at shutdown

    def clear(self) -> None:
        """Empty the pipe: the reader is about to look at everything queued so far."""
        try:
            while os.read(self.fd, 4096):
                pass
        except BlockingIOError:
            pass

    def close(self) -> None:
        for fd in (self.fd, self._write_fd):
            try:
                os.close(fd)
            except OSError:
                pass
