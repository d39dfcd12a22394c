"""`memchat mcp` (stdio) as a desktop client runs it: a long-lived process
acting for one token, so each tool call checks that the token has not
expired and that its user still exists; without the MCP SDK it says what to
install; offline, it does not log model requests that never left it.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import jwt
import psycopg
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from tests.mcp_server.test_mcp_server import error_of, result_of
from tests.utils.dev_server import MEMCHAT, DevServer
from tests.utils.fake_openai import FakeOpenAI

LEEWAY_SECONDS = 10  # the verifier's, on `exp` (memchat.auth)


@asynccontextmanager
async def stdio(
    dev: DevServer, token: str, stderr: Path, env: dict[str, str] | None = None
) -> AsyncIterator[ClientSession]:
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "memchat.cli", "mcp"],
        env={**(env or dev.env), "MEMCHAT_TOKEN": token},
        cwd=str(dev.home),
    )
    with stderr.open("w") as errlog:
        async with (
            stdio_client(params, errlog=errlog) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            yield session


def short_token(dev: DevServer, user_id: uuid.UUID, ttl: int) -> str:
    return subprocess.run(
        [*MEMCHAT, "token", "--user-id", str(user_id), "--ttl", str(ttl)],
        env=dev.env,
        cwd=dev.home,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.strip()


def notes_of(admin: psycopg.Connection, user_id: uuid.UUID) -> Any:
    return admin.execute(
        "select notes from public.agent_long_term_memory where user_id = %s", (user_id,)
    ).fetchone()


async def test_an_expired_token_stops_every_tool(
    dev: DevServer, dev_model: FakeOpenAI, admin: psycopg.Connection, tmp_path: Path
) -> None:
    user_id = uuid.uuid4()
    token = short_token(dev, user_id, ttl=2)
    expires = jwt.decode(token, options={"verify_signature": False})["exp"]
    async with stdio(dev, token, tmp_path / "stderr") as session:
        result_of(await session.call_tool("read_notes", {}))
        await asyncio.sleep(max(0.0, expires + LEEWAY_SECONDS + 1 - time.time()))
        for name, arguments in (
            ("update_notes", {"notes": "- written after expiry"}),
            ("search_memory", {"query": "anything"}),
            ("list_sessions", {}),
            ("get_session", {"session_id": "not even a uuid"}),
        ):
            text = error_of(await session.call_tool(name, arguments))
            assert text == (
                "unauthorized: The access token has expired; get a new one"
                " (locally: `memchat token`) and restart `memchat mcp` with it."
            ), name
    assert notes_of(admin, user_id) is None  # nothing was written
    assert dev_model.embedding_requests == []  # nor the query embedded


async def test_a_deleted_account_stops_every_tool(
    dev: DevServer, dev_model: FakeOpenAI, admin: psycopg.Connection, tmp_path: Path
) -> None:
    user_id = uuid.uuid4()
    async with stdio(dev, dev.token(user_id), tmp_path / "stderr") as session:
        result_of(await session.call_tool("list_sessions", {}))
        admin.execute("delete from auth.users where id = %s", (user_id,))
        dev_model.reset()
        for name, arguments in (
            ("search_memory", {"query": "anything"}),
            ("update_notes", {"notes": "- written after deletion"}),
            ("read_notes", {}),
        ):
            text = error_of(await session.call_tool(name, arguments))
            assert text == ("unauthorized: This account no longer exists; nothing was done."), name
    assert notes_of(admin, user_id) is None
    assert dev_model.embedding_requests == []  # the query was not even embedded


# `import mcp` fails as it does where the package is not installed (the venv
# infra/dev.sh builds has no `mcp` extra); memchat's own code runs unchanged.
WITHOUT_MCP = (
    "import sys; sys.modules['mcp'] = None; from memchat.cli import main; sys.exit(main(['mcp']))"
)


def test_without_the_sdk_memchat_mcp_says_what_to_install(dev: DevServer) -> None:
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_MCP],
        env={**dev.env, "MEMCHAT_TOKEN": dev.token()},
        cwd=dev.home,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert "Traceback" not in done.stderr
    assert done.stderr.strip() == (
        "memchat mcp: the MCP SDK is not installed: install memchat's mcp extra"
        " (in a checkout: .venv/bin/pip install -e '.[mcp]'; else: pip install 'memchat[mcp]')."
    )


async def test_offline_it_logs_no_model_request(dev: DevServer, tmp_path: Path) -> None:
    # No key: the offline responder embeds, in this process.
    offline = {k: v for k, v in dev.env.items() if not k.startswith("OPENAI_")}
    stderr = tmp_path / "stderr"
    async with stdio(dev, dev.token(), stderr, env=offline) as session:
        result_of(await session.call_tool("search_memory", {"query": "anything at all"}))
    logged = stderr.read_text()
    assert "HTTP Request" not in logged and "api.openai.com" not in logged, logged


async def test_with_a_model_its_requests_are_still_logged(
    dev: DevServer, dev_model: FakeOpenAI, tmp_path: Path
) -> None:
    stderr = tmp_path / "stderr"
    async with stdio(dev, dev.token(), stderr) as session:
        result_of(await session.call_tool("search_memory", {"query": "anything at all"}))
    assert len(dev_model.embedding_requests) == 1
    # The SDK's log handler wraps lines at its width: compared without the breaks.
    logged = "".join(stderr.read_text().split())
    assert "HTTPRequest:POST" in logged and f"{dev_model.url}/embedding" in logged, logged
