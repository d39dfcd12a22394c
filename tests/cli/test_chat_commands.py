"""`memchat chat`'s commands (/help, /new, /sessions, /resume, /export,
--session): the real command against a real `memchat dev` (its model the
fake OpenAI server, which echoes)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from memchat.cli.chat import COMMANDS
from tests.utils.dev_server import DevServer
from tests.utils.fake_openai import FakeOpenAI
from tests.utils.terminal_chat import AGENT, PROMPT, Chat


@pytest.fixture
def chat(dev: DevServer, tmp_path: Path) -> Iterator[Callable[..., Chat]]:
    """Starts `memchat chat` runs (HOME: tmp_path), each for a fresh user
    unless given a token."""
    runs: list[Chat] = []

    def start(*args: str, token: str | None = None) -> Chat:
        runs.append(Chat(dev, token or dev.token(), *args, home=tmp_path))
        return runs[-1]

    yield start
    for run in runs:
        run.close()


def messages_in(admin: psycopg.Connection, session_id: str | uuid.UUID) -> int:
    row = admin.execute(
        "select count(*) from public.chat_message_history where session_id = %s",
        (str(session_id),),
    ).fetchone()
    assert row is not None
    return int(row[0])


def test_help_lists_the_commands_and_an_unknown_one_points_to_it(
    chat: Callable[..., Chat], dev_model: FakeOpenAI
) -> None:
    run = chat()
    assert run.output.endswith("/help lists the commands; Ctrl-D or /quit to leave.\n\n" + PROMPT)
    assert run.turn("/help") == COMMANDS + "\n" + PROMPT
    for name in ("/new", "/sessions", "/resume", "/clear", "/export", "/notes", "/quit"):
        assert f"\n  {name} " in COMMANDS
    assert run.turn("/nope") == "(no command /nope: /help lists them)\n" + PROMPT
    assert dev_model.calls == 0
    run.quit()


def test_new_sessions_and_resume(
    chat: Callable[..., Chat], dev_model: FakeOpenAI, admin: psycopg.Connection
) -> None:
    run = chat()
    first = str(run.session_id)
    run.turn("hello first")
    new = run.turn("/new")
    assert new.startswith("(new session ")
    second = new.split("new session ", 1)[1].split(")")[0]
    assert second != first
    assert f"{AGENT}> echo: in the second\n" in run.turn("in the second")
    assert (messages_in(admin, first), messages_in(admin, second)) == (2, 2)

    listed = run.turn("/sessions").splitlines()
    assert listed[0].startswith(f"* {second}  2 messages  active  last active ")
    assert listed[1].startswith(f"  {first}  2 messages  active  last active ")
    assert listed[2:] == ["(/resume ID goes on with one)", PROMPT]

    resumed = run.turn(f"/resume {first[:8]}")
    assert resumed == f"(resumed session {first}: 2 messages)\n" + PROMPT
    run.turn("back in the first")
    assert messages_in(admin, first) == 4
    assert "(no session of agent cli starting with ffff" in run.turn("/resume ffff")
    assert run.quit().endswith(f"bye (session {first})\n")


def test_session_option_resumes_explicitly(
    chat: Callable[..., Chat], dev: DevServer, dev_model: FakeOpenAI, admin: psycopg.Connection
) -> None:
    token = dev.token()
    run = chat(token=token)
    run.turn("remember this session")
    run.quit()
    again = chat("--session", str(run.session_id), token=token)
    assert again.session_id == run.session_id
    assert f"(resumed session {run.session_id}: 2 messages)" in again.output
    again.turn("and more")
    assert messages_in(admin, run.session_id) == 4
    again.quit()


def test_export_writes_to_the_home_directory_or_the_file_given(
    chat: Callable[..., Chat], dev_model: FakeOpenAI, tmp_path: Path
) -> None:
    run = chat()
    assert run.turn("/export") == "(nothing to export yet)\n" + PROMPT
    run.turn("export me")
    default = tmp_path / f"memchat-session-{run.session_id}.json"
    assert run.turn("/export") == f"(exported session {run.session_id} to {default})\n" + PROMPT
    exported = json.loads(default.read_text())
    assert [m["content"] for m in exported["messages"]] == ["export me", "echo: export me"]
    chosen = tmp_path / "chosen.json"
    run.turn(f"/export {chosen}")
    assert json.loads(chosen.read_text()) == exported
    run.quit()
