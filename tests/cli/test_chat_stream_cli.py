"""`memchat chat` streams its answers: the real command in a subprocess,
talking to a real `memchat dev` whose model is the fake OpenAI server,
pacing its chunks so that an answer takes seconds to write.

The command's stdout is read as it comes (tests/utils/terminal_chat.py), so
the tests see what a person at the terminal sees, and when.
"""

from __future__ import annotations

import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator

import psycopg
import pytest

from tests.utils.dev_server import MEMCHAT, DevServer
from tests.utils.fake_openai import FakeOpenAI, tool_call
from tests.utils.processes import free_port
from tests.utils.terminal_chat import AGENT, PROMPT, Chat

# The model paces its answers: seconds between the pieces (conftest `dev_model`).
MODEL_CHUNK_DELAY = 0.3


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
    # The run goes on, and its exit code says that a request failed.
    assert run.quit(code=1).endswith(f"bye (session {run.session_id})\n")
    assert run.stderr() == "1 request of this run failed\n"


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


def test_clear_asks_first_then_starts_a_new_session(
    chat: Callable[[], Chat], dev_model: FakeOpenAI, admin: psycopg.Connection
) -> None:
    run = chat()
    assert "(nothing to clear yet)" in run.turn("/clear")
    run.turn("hello")
    kept = run.confirm("/clear", "n")
    assert kept == (
        f"delete the 2 messages of session {run.session_id} for good?"
        " The long-term notes stay (/notes). [y/N] (not cleared)\n" + PROMPT
    )
    assert len(stored(admin, run.session_id)) == 2
    cleared = run.confirm("/clear", "y")
    assert "(cleared 2 messages; new session " in cleared
    assert stored(admin, run.session_id) == []
    new_session = cleared.split("new session ", 1)[1].split(")")[0]
    assert run.quit().endswith(f"bye (session {new_session})\n")


def chat_once(dev: DevServer, url: str, token: str) -> subprocess.CompletedProcess[str]:
    """`memchat chat` at `url` with `token`, sent one line (then EOF)."""
    return subprocess.run(
        [*MEMCHAT, "chat", "--url", url, "--token", token],
        input="hello\n",
        env=dev.env,
        cwd=dev.home,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_refused_token_is_said_once_before_the_first_prompt_and_exits_1(
    dev: DevServer,
) -> None:
    result = chat_once(dev, dev.url, "not-a-token")
    assert result.returncode == 1, result.stderr
    assert result.stdout == (
        "! 401 unauthorized: The access token is malformed; send it exactly as Supabase"
        " issued it; locally, get a new one with `memchat token`.\n"
    )
    assert PROMPT not in result.stdout


def test_an_api_that_does_not_answer_is_said_before_the_first_prompt(dev: DevServer) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    result = chat_once(dev, url, dev.token())
    assert result.returncode == 1, result.stderr
    assert result.stdout.startswith(
        f"! cannot reach the API at {url} (start it with `memchat dev`): "
    ), result.stdout
    assert result.stdout.rstrip().endswith("; or pass --url")
    assert PROMPT not in result.stdout
