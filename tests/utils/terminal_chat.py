"""`memchat chat` in a subprocess, its stdout read as it comes (a thread
keeps every read), so a test sees what a person at the terminal sees, and when."""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from tests.utils.dev_server import MEMCHAT, DevServer
from tests.utils.processes import STARTUP_SECONDS

AGENT = "cli"
PROMPT = "you> "
CONFIRM = "[y/N] "


class Chat:
    """`memchat chat` in a subprocess; every read of its stdout is kept."""

    def __init__(self, dev: DevServer, token: str, *args: str, home: Path | None = None) -> None:
        # Without PYTHONUNBUFFERED: the command must flush by itself.
        env = {k: v for k, v in dev.env.items() if k != "PYTHONUNBUFFERED"}
        if home is not None:
            env["HOME"] = str(home)
        self.proc = subprocess.Popen(
            [*MEMCHAT, "chat", "--url", dev.url, "--agent", AGENT, "--token", token, *args],
            env=env,
            cwd=dev.home,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self.reads: list[str] = []  # the whole output after each read
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        # Its first prompt says it started: the imports, the server's answer.
        self.wait_for(lambda out: out.endswith(PROMPT), "the first prompt", STARTUP_SECONDS)
        # The session it shows: "new session <id>" or "(resumed session <id>: ...)".
        found = re.search(r"session ([0-9a-f-]{36})", self.output)
        assert found, self.output
        self.session_id = uuid.UUID(found.group(1))

    def _read(self) -> None:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        data = b""
        while chunk := os.read(fd, 65536):
            data += chunk
            with self._lock:
                self.reads.append(data.decode(errors="replace"))

    @property
    def output(self) -> str:
        with self._lock:
            return self.reads[-1] if self.reads else ""

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()

    def wait_for(self, ready: Callable[[str], bool], what: str, timeout: float = 60) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            output = self.output
            if ready(output):
                return output
            if self.proc.poll() is not None and not self._reader.is_alive():
                break
            time.sleep(0.01)
        raise AssertionError(f"waiting for {what}; the output so far:\n{self.output}")

    def turn(self, line: str, what: str = "the next prompt") -> str:
        """Send a line; the output it made, once the prompt is back."""
        before = len(self.output)
        self.send(line)
        out = self.wait_for(lambda out: len(out) > before and out.endswith(PROMPT), what)
        return out[before:]

    def confirm(self, line: str, answer: str) -> str:
        """Send a line that asks first (/clear), then `answer`; the output of both."""
        before = len(self.output)
        self.send(line)
        self.wait_for(lambda out: len(out) > before and out.endswith(CONFIRM), "the question")
        self.turn(answer)
        return self.output[before:]

    def quit(self, code: int = 0) -> str:
        """Leave with /quit; the whole output, once it exited with `code`."""
        self.send("/quit")
        try:
            self.proc.wait(timeout=30)
        finally:
            self._reader.join(timeout=10)
        assert self.proc.returncode == code, self.stderr()
        return self.output

    def stderr(self) -> str:
        assert self.proc.stderr is not None
        return self.proc.stderr.read().decode(errors="replace")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()
