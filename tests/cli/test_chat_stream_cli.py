"""`memchat chat` streams its answers: the real command in a subprocess,
talking to a real `memchat dev` whose model is the fake OpenAI server,
pacing its chunks so that an answer takes seconds to write.

The command's stdout is read as it comes (a thread keeps every read), so
the tests see what a person at the terminal sees, and when.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator

import psycopg
import pytest

from tests.utils.dev_server import MEMCHAT, DevServer
from tests.utils.fake_openai import FakeOpenAI, tool_call

AGENT = "cli"
PROMPT = "you> "


# The model paces its answers: seconds between the pieces (conftest `dev_model`).
MODEL_CHUNK_DELAY = 0.3


class Chat:
    """`memchat chat` in a subprocess; every read of its stdout is kept."""

    def __init__(self, dev: DevServer, token: str) -> None:
        self.proc = subprocess.Popen(
            [*MEMCHAT, "chat", "--url", dev.url, "--agent", AGENT, "--token", token],
            # Without PYTHONUNBUFFERED: the command must flush by itself.
            env={k: v for k, v in dev.env.items() if k != "PYTHONUNBUFFERED"},
            cwd=dev.home,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self.reads: list[str] = []  # the whole output after each read
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.wait_for(lambda out: out.endswith(PROMPT), "the first prompt")
        self.session_id = uuid.UUID(self.output.split("session ", 1)[1].split()[0])

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

    def wait_for(self, ready: Callable[[str], bool], what: str, timeout: float = 30) -> str:
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

    def quit(self) -> str:
        self.send("/quit")
        try:
            self.proc.wait(timeout=30)
        finally:
            self._reader.join(timeout=10)
        assert self.proc.returncode == 0, self.stderr()
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


@pytest.fixture
def chat(dev: DevServer) -> Iterator[Callable[[], Chat]]:
    """Starts `memchat chat` runs, each for a fresh user."""
    runs: list[Chat] = []

    def start() -> Chat:
        runs.append(Chat(dev, dev.token()))
        return runs[-1]

    yield start
    for run in runs:
        run.close()


def stored(admin: psycopg.Connection, session_id: uuid.UUID) -> list[tuple[str, str]]:
    rows = admin.execute(
        "select message->>'type', message->'data'->>'content' from public.chat_message_history"
        " where session_id = %s order by id",
        (session_id,),
    ).fetchall()
    return [(str(kind), str(content)) for kind, content in rows]


def test_the_answer_is_printed_as_it_streams(
    chat: Callable[[], Chat], dev_model: FakeOpenAI, admin: psycopg.Connection
) -> None:
    answer = "alpha bravo charlie delta echo foxtrot"
    dev_model.script({"content": answer})
    run = chat()

    said = run.turn("spell something")

    assert f"{AGENT}> {answer}\n\n" in said
    # The answer's first word was on stdout while the last was still to come
    # (six words 0.3 s apart: about 1.5 s before the end), and it grew in steps.
    first = next(out for out in run.reads if f"{AGENT}> alpha" in out)
    assert "foxtrot" not in first
    partial = {out for out in run.reads if f"{AGENT}> alpha" in out and "foxtrot" not in out}
    assert len(partial) >= 3, partial
    assert stored(admin, run.session_id) == [("human", "spell something"), ("ai", answer)]
    assert run.quit().endswith(f"bye (session {run.session_id})\n")


def test_a_notes_change_is_announced_on_its_own_line(
    chat: Callable[[], Chat], dev_model: FakeOpenAI
) -> None:
    dev_model.script(
        tool_call("append", content="- Prefers green tea"), {"content": "Noted: green tea."}
    )
    run = chat()

    said = run.turn("remember that I like green tea")

    assert f"(notes: append)\n{AGENT}> Noted: green tea. (notes updated)\n\n" in said, said
    assert "- Prefers green tea" in run.turn("/notes")
    run.quit()


def test_a_model_failure_mid_answer_is_an_error_line_and_the_session_goes_on(
    chat: Callable[[], Chat], dev_model: FakeOpenAI, admin: psycopg.Connection
) -> None:
    dev_model.script({"content": "one two three four five six", "fail_after": 2})
    run = chat()

    failed = run.turn("tell me")

    assert failed.startswith(f"{AGENT}> one "), failed
    assert "\n! model_upstream_error: " in failed, failed  # on a line of its own
    assert "three" not in failed
    assert stored(admin, run.session_id) == []  # a failed turn stores nothing
    again = run.turn("still there?")
    assert f"{AGENT}> echo: still there?\n" in again
    assert stored(admin, run.session_id) == [
        ("human", "still there?"),
        ("ai", "echo: still there?"),
    ]
    run.quit()


def test_ctrl_c_stops_the_answer_and_the_turn_is_still_stored(
    chat: Callable[[], Chat], dev_model: FakeOpenAI, admin: psycopg.Connection
) -> None:
    answer = "one two three four five six seven eight nine ten"
    dev_model.script({"content": answer})
    run = chat()

    before = len(run.output)
    run.send("count to ten")
    run.wait_for(lambda out: f"{AGENT}> one" in out[before:], "the first word")
    run.proc.send_signal(signal.SIGINT)
    stopped = run.wait_for(lambda out: out.endswith(PROMPT) and len(out) > before, "the prompt")

    assert "(stopped; the server still finishes and stores this turn)\n" in stopped[before:]
    deadline = time.monotonic() + 30
    while len(stored(admin, run.session_id)) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert stored(admin, run.session_id) == [("human", "count to ten"), ("ai", answer)]
    assert "ten" not in run.output[before:]  # nothing more was printed
    assert f"{AGENT}> echo: and now?\n" in run.turn("and now?")
    run.quit()


def test_clear_starts_a_new_session(chat: Callable[[], Chat], dev_model: FakeOpenAI) -> None:
    run = chat()
    assert "(nothing to clear yet)" in run.turn("/clear")
    run.turn("hello")
    cleared = run.turn("/clear")
    assert "(cleared 2 messages; new session " in cleared
    new_session = cleared.split("new session ", 1)[1].split(")")[0]
    assert run.quit().endswith(f"bye (session {new_session})\n")


def test_a_failure_before_the_stream_is_the_http_error(dev: DevServer) -> None:
    result = subprocess.run(
        [*MEMCHAT, "chat", "--url", dev.url, "--token", "not-a-token"],
        input="hello\n",
        env=dev.env,
        cwd=dev.home,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert f"{PROMPT}! 401 unauthorized: " in result.stdout, result.stdout
    session_id = result.stdout.split("session ", 1)[1].split()[0]
    assert result.stdout.rstrip().endswith(f"bye (session {session_id})")
