"""The MCP server with the `mcp` SDK's own client, over both transports:
streamable HTTP at POST /mcp of `memchat dev`, and `memchat mcp` on stdio.

Every tool is listed and called, against the real database; the memory the
tools read was made by chat turns through the API (the model is the fake
OpenAI server), and what they change is checked in the database.
"""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import httpx
import httpx2
import psycopg
import pytest
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from memchat import bootstrap
from tests.conftest import make_settings
from tests.utils.api import ApiClient
from tests.utils.chat_api import assert_error
from tests.utils.dev_server import DevServer
from tests.utils.fake_openai import FakeOpenAI

TOOLS = {
    "search_memory",
    "read_notes",
    "update_notes",
    "list_memories",
    "forget_memory",
    "list_sessions",
    "get_session",
}

Connect = Callable[[str], AbstractAsyncContextManager[ClientSession]]


@asynccontextmanager
async def over_http(dev: DevServer, token: str) -> AsyncIterator[ClientSession]:
    headers = {"Authorization": f"Bearer {token}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=30) as http,
        streamable_http_client(f"{dev.url}/mcp", http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


@asynccontextmanager
async def over_stdio(dev: DevServer, token: str) -> AsyncIterator[ClientSession]:
    # The same database and model (so the same embeddings) as `memchat dev`.
    env = {**dev.env, "MEMCHAT_TOKEN": token}
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "memchat.cli", "mcp"], env=env, cwd=str(dev.home)
    )
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


@pytest.fixture(params=["http", "stdio"])
def connect(request: pytest.FixtureRequest, dev: DevServer) -> Connect:
    opener = over_http if request.param == "http" else over_stdio
    return lambda token: opener(dev, token)


def result_of(result: Any) -> dict[str, Any]:
    """A successful tool call's structured result."""
    assert not result.is_error, result.content
    content: dict[str, Any] = result.structured_content
    return content


def error_of(result: Any) -> str:
    """A failed tool call's error text, the SDK's "Error executing tool <name>: " left out."""
    assert result.is_error, result
    (block,) = result.content
    prefix, _, text = block.text.partition(": ")
    assert prefix.startswith("Error executing tool "), block.text
    return str(text)


async def chat(dev: DevServer, token: str, message: str, **fields: Any) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=dev.url, timeout=30) as client:
        r = await client.post(
            "/chat",
            json={"message": message, **fields},
            headers={"Authorization": f"Bearer {token}"},
        )
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


async def test_every_tool_is_listed_and_works(
    connect: Connect, dev: DevServer, dev_model: FakeOpenAI, admin: psycopg.Connection
) -> None:
    user_id = uuid.uuid4()
    token = dev.token(user_id)
    dev_model.script({"content": "Noted: your dentist is Dr. Moreau."})
    first = await chat(dev, token, "My dentist is Dr. Moreau")
    await chat(dev, token, "Unrelated: I like sailing", session_id=str(uuid.uuid4()))

    async with connect(token) as session:
        listed = await session.list_tools()
        assert {tool.name for tool in listed.tools} == TOOLS
        for tool in listed.tools:
            assert tool.description and tool.input_schema["type"] == "object"
            assert "\n    " not in tool.description  # the docstring's indentation left out

        found = result_of(await session.call_tool("search_memory", {"query": "dentist", "k": 3}))
        top = found["hits"][0]
        assert top["question"] == "My dentist is Dr. Moreau"
        assert top["answer"] == "Noted: your dentist is Dr. Moreau."
        assert top["session_id"] == first["session_id"]

        notes = result_of(await session.call_tool("read_notes", {}))
        assert (notes["notes"], notes["version"]) == ("", 0)
        saved = result_of(
            await session.call_tool(
                "update_notes", {"notes": "- dentist: Dr. Moreau", "expected_version": 0}
            )
        )
        assert saved["version"] == 1
        stale = await session.call_tool(
            "update_notes", {"notes": "- overwritten", "expected_version": 0}
        )
        assert error_of(stale).startswith("notes_conflict: ")
        assert result_of(await session.call_tool("read_notes", {}))["notes"] == (
            "- dentist: Dr. Moreau"
        )

        sessions = result_of(await session.call_tool("list_sessions", {"limit": 10}))["sessions"]
        assert len(sessions) == 2 and first["session_id"] in {s["id"] for s in sessions}

        got = result_of(await session.call_tool("get_session", {"session_id": first["session_id"]}))
        assert got["session"]["id"] == first["session_id"]
        assert [(m["role"], m["content"]) for m in got["messages"]] == [
            ("user", "My dentist is Dr. Moreau"),
            ("assistant", "Noted: your dentist is Dr. Moreau."),
        ]
        last = result_of(
            await session.call_tool("get_session", {"session_id": first["session_id"], "last": 1})
        )
        assert [m["content"] for m in last["messages"]] == ["Noted: your dentist is Dr. Moreau."]

    row = admin.execute(
        "select notes, version from public.agent_long_term_memory where user_id = %s", (user_id,)
    ).fetchone()
    assert row == ("- dentist: Dr. Moreau", 1)
    # Never what was said, searched or noted in the server's logs.
    assert "Moreau" not in dev.output() and "dentist" not in dev.output()


async def test_memories_are_listed_searched_and_forgotten(
    connect: Connect, dev: DevServer, dev_model: FakeOpenAI, worker_url: str
) -> None:
    token = dev.token()
    dev_model.script(
        {"content": "I will remember that you sail on Sundays."},
        {"content": "Zurich is lovely in spring."},  # says nothing of itself: no memory
    )
    await chat(dev, token, "I sail on Lake Constance every Sunday.")
    await chat(dev, token, "I moved to Zurich last spring.", session_id=str(uuid.uuid4()))
    embedder = bootstrap.embedder(make_settings(worker_url, dev_model.url, job="summaries"))
    try:
        await embedder.run()
    finally:
        await embedder.close()
    async with connect(token) as session:
        listed = result_of(await session.call_tool("list_memories", {}))["memories"]
        assert [m["text"] for m in listed] == [
            "I moved to Zurich last spring.",
            "I will remember that you sail on Sundays.",
            "I sail on Lake Constance every Sunday.",
        ]
        found = result_of(await session.call_tool("list_memories", {"query": "Zurich move"}))
        top = found["memories"][0]
        assert top["text"] == "I moved to Zurich last spring." and top["kind"] == "fact"
        gone = result_of(await session.call_tool("forget_memory", {"memory_id": top["id"]}))
        assert gone == {"deleted": 1, "memory_id": top["id"]}
        again = await session.call_tool("forget_memory", {"memory_id": top["id"]})
        assert error_of(again).startswith("memory_not_found: ")
        left = result_of(await session.call_tool("list_memories", {"limit": 5}))["memories"]
        assert "I moved to Zurich last spring." not in [m["text"] for m in left]
    async with connect(dev.token()) as stranger:
        assert result_of(await stranger.call_tool("list_memories", {}))["memories"] == []
        theirs = await stranger.call_tool("forget_memory", {"memory_id": left[0]["id"]})
        assert error_of(theirs).startswith("memory_not_found: ")


async def test_tools_see_only_the_callers_data(
    connect: Connect, dev: DevServer, dev_model: FakeOpenAI
) -> None:
    owner = dev.token()
    theirs = await chat(dev, owner, "my locker code is 4711")
    async with connect(dev.token()) as session:
        missing = await session.call_tool("get_session", {"session_id": theirs["session_id"]})
        assert error_of(missing).startswith("session_not_found: ")
        found = result_of(await session.call_tool("search_memory", {"query": "locker code"}))
        assert found["hits"] == []
        assert result_of(await session.call_tool("list_sessions", {}))["sessions"] == []
        bad = await session.call_tool("get_session", {"session_id": "nope"})
        assert error_of(bad).startswith("bad_request: ")
        invalid = await session.call_tool("search_memory", {"query": ""})
        assert error_of(invalid) == (
            "validation_error: query: String should have at least 1 character."
        )
        blank = await session.call_tool("search_memory", {"query": "   "})
        assert error_of(blank) == "bad_request: query is blank."


async def test_http_mcp_needs_the_apis_token(dev: DevServer) -> None:
    message = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    headers = {"Accept": "application/json, text/event-stream"}
    async with httpx.AsyncClient(base_url=dev.url, timeout=30) as client:
        for authorization in (None, "Bearer garbage"):
            sent = {**headers, **({"Authorization": authorization} if authorization else {})}
            r = await client.post("/mcp", json=message, headers=sent)
            assert_error(r, 401, "unauthorized")
        r = await client.post(
            "/mcp", json=message, headers={**headers, "Authorization": f"Bearer {dev.token()}"}
        )
    assert r.status_code == 200, r.text
    assert {tool["name"] for tool in json.loads(r.text)["result"]["tools"]} == TOOLS


async def test_argument_errors_are_sentences_naming_the_field(
    connect: Connect, dev: DevServer
) -> None:
    async with connect(dev.token()) as session:
        nul = await session.call_tool("search_memory", {"query": "my \x00 secret"})
        assert error_of(nul) == (
            "validation_error: query: must not contain NUL (U+0000) characters."
        )
        only_nul = await session.call_tool("search_memory", {"query": "\x00"})
        assert error_of(only_nul) == error_of(nul)
        several = await session.call_tool(
            "search_memory", {"query": "x", "k": 0, "agent_name": "bad name!"}
        )
        text = error_of(several)
        assert text.startswith("validation_error: ") and text.endswith(".")
        assert "k: Input should be greater than or equal to 1" in text
        assert "agent_name: String should match pattern" in text
        missing = await session.call_tool("get_session", {})
        assert error_of(missing) == "validation_error: session_id: is required."
        wrong_type = await session.call_tool("list_sessions", {"limit": "many"})
        assert error_of(wrong_type).startswith("validation_error: limit: ")
    # Never what was sent, in the answer or the logs.
    assert "secret" not in dev.output()


async def test_http_mcp_without_the_sdk_is_501_saying_what_to_install(
    api: ApiClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As where the package is not installed: `import mcp` fails (restored after).
    for name in [m for m in sys.modules if m == "mcp" or m.startswith("mcp.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "mcp", None)
    _, auth = api.new_user()
    message = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    r = await api.post("/mcp", json=message, headers=auth)
    assert_error(r, 501, "mcp_unavailable")
    assert ".venv/bin/pip install -e '.[mcp]'" in r.json()["detail"]


def test_memchat_mcp_refuses_to_start_without_a_token(dev: DevServer) -> None:
    import subprocess

    env = {k: v for k, v in dev.env.items() if k != "MEMCHAT_TOKEN"}
    done = subprocess.run(
        [sys.executable, "-m", "memchat.cli", "mcp"],
        env=env,
        cwd=dev.home,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert "MEMCHAT_TOKEN" in done.stderr
