"""Servers the tests start as processes: a free port, waiting for health, stopping."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Callable

import httpx


def free_port() -> int:
    """A TCP port of 127.0.0.1 free right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_healthy(
    url: str,
    process: subprocess.Popen[bytes],
    output: Callable[[], str],
    what: str,
    timeout: float = 60,
) -> None:
    """Poll `url` + /health until 200 (as Lambda's web adapter does); fail with
    the server's `output` if it exits or stays unhealthy for `timeout` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"{what} exited ({process.returncode}):\n{output()}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"{what} did not answer on /health within {timeout:g} s:\n{output()}")


def stop(process: subprocess.Popen[bytes], timeout: float = 15) -> None:
    """SIGTERM, then SIGKILL if it does not exit within `timeout` s."""
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=5)
