"""Real operations tools around a real server, for tests: a Prometheus that scrapes it and an
haproxy in front of several, each a child process on loopback with its own temporary config and
data, on free ports, stopped and waited for at the end."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_http(url: str, proc: subprocess.Popen, timeout: float, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url} did not answer within {timeout} s:\n{log.read_text()[-3000:]}")
        time.sleep(0.1)  # polling a child process's HTTP port: nothing else tells us it is up


@contextlib.contextmanager
def _child(args: list[str], log: Path) -> Iterator[subprocess.Popen]:
    with open(log, "wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


class Prometheus:
    def __init__(self, url: str) -> None:
        self.url = url

    def query(self, expr: str) -> list[dict]:
        reply = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=5).json()
        assert reply["status"] == "success", reply
        return reply["data"]["result"]

    def value(self, expr: str) -> float | None:
        """The single value of an instant query (None while there is no such series)."""
        result = self.query(expr)
        return float(result[0]["value"][1]) if result else None

    def wait_for(self, expr: str, predicate, timeout: float = 30.0) -> float:
        """Query until the value satisfies ``predicate`` (the next scrapes have to land first)."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.value(expr)
            if value is not None and predicate(value):
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"{expr} = {value} after {timeout} s")
            time.sleep(0.2)


@contextlib.contextmanager
def prometheus(targets: list[str], workdir: Path, bearer: str | None = None) -> Iterator[Prometheus]:
    """Debian's ``prometheus`` scraping ``targets`` (host:port) every 0.5 s (with ``Authorization:
    Bearer <bearer>`` when given)."""
    port = free_port()
    config = workdir / "prometheus.yml"
    auth = f"    authorization: {{type: Bearer, credentials: {bearer!r}}}\n" if bearer else ""
    config.write_text(
        "global: {scrape_interval: 500ms, evaluation_interval: 500ms}\n"
        "scrape_configs:\n"
        "  - job_name: duplex\n    metrics_path: /metrics\n    scrape_interval: 500ms\n" + auth +
        f"    static_configs: [{{targets: [{', '.join(repr(t) for t in targets)}]}}]\n")
    args = ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"]
    log = workdir / "prometheus.log"
    with _child(args, log) as proc:
        _wait_http(f"http://127.0.0.1:{port}/-/ready", proc, 60, log)
        yield Prometheus(f"http://127.0.0.1:{port}")


HAPROXY_CONFIG = """\
global
    maxconn 256
    log stdout format raw local0
defaults
    mode http
    log global
    option httplog
    timeout connect 2s
    timeout client 60s
    timeout server 60s
    # A busy 2-core box can keep a server's event loop from answering /readyz for a while: a slow
    # answer is not a "no".
    timeout check 3s
    # A call sent to a server that has just begun draining gets 503: try it on another one.
    retries 3
    option redispatch 1
    retry-on 503 conn-failure empty-response
frontend calls
    bind 127.0.0.1:{port}
    option http-buffer-request
    default_backend duplex
backend duplex
    balance roundrobin
    option httpchk GET /readyz
    http-check expect status 200
    # The hang-up (DELETE of the call's URL) must reach the server holding the call, draining or not.
    cookie DUPLEX insert indirect nocache
    option persist
{servers}
"""


@contextlib.contextmanager
def haproxy(backends: dict[str, str], workdir: Path) -> Iterator[str]:
    """Debian's ``haproxy`` in front of ``backends`` (name -> host:port), health-checking
    ``/readyz`` every 250 ms; yields its URL."""
    port = free_port()
    servers = "\n".join(f"    server {name} {address} check inter 250ms fall 2 rise 1 cookie {name}"
                        for name, address in backends.items())
    config = workdir / "haproxy.cfg"
    config.write_text(HAPROXY_CONFIG.format(port=port, servers=servers))
    log = workdir / "haproxy.log"
    with _child(["haproxy", "-db", "-f", str(config)], log) as proc:
        _wait_http(f"http://127.0.0.1:{port}/healthz", proc, 30, log)
        yield f"http://127.0.0.1:{port}"
