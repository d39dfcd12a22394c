"""Servers the tests start as processes: a free port, waiting until one says
it is ready, stopping."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Callable
from typing import Any

import httpx

# How long a server may take to say it is ready. A server that is ready ends
# the wait at once, so this only bounds one that never gets there: long
# enough for a first start (initdb, imports) on a loaded CI machine.
STARTUP_SECONDS = 180.0


def free_port() -> int:
    """A TCP port of 127.0.0.1 free right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_ready(
    ready: Callable[[], bool],
    process: subprocess.Popen[Any] | None,
    output: Callable[[], str],
    what: str,
    timeout: float = STARTUP_SECONDS,
) -> None:
    """Poll `ready()` until it is true; fail with the server's `output` if
    `process` exits first or `ready()` is still false after `timeout` s.

    `ready` asks the server itself (an endpoint that answers, a line it
    printed, a connection through it), never the clock; it is asked once
    more after the deadline, so a server slowed down by the machine is not
    failed for the time it took to poll it.
    """
    deadline = time.monotonic() + timeout
    while True:
        if process is not None and process.poll() is not None:
            raise AssertionError(f"{what} exited ({process.returncode}):\n{output()}")
        if ready():
            return
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what} was not ready within {timeout:g} s:\n{output()}")
        time.sleep(0.05)


def answers_health(url: str) -> bool:
    """Whether `url` + /health answers 200 (as Lambda's web adapter checks)."""
    try:
        # A server that answers, slowly, on a loaded machine is healthy.
        return httpx.get(f"{url}/health", timeout=10).status_code == 200
    except httpx.HTTPError:
        return False


def wait_healthy(
    url: str,
    process: subprocess.Popen[bytes],
    output: Callable[[], str],
    what: str,
    timeout: float = STARTUP_SECONDS,
) -> None:
    """Poll `url` + /health until 200 (as Lambda's web adapter does); fail with
    the server's `output` if it exits or stays unhealthy for `timeout` s."""
    wait_ready(lambda: answers_health(url), process, output, f"{what} on {url}/health", timeout)


def stop(process: subprocess.Popen[bytes], timeout: float = 15) -> None:
    """SIGTERM, then SIGKILL if it does not exit within `timeout` s."""
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=5)
