"""Lambda SnapStart: the hooks run as the runtime runs them, against the real database.

The chat handler is imported as a fresh Lambda instance would (its module
scope is the init phase), requests go through it as in test_http.py, then the
before-snapshot and after-restore hooks run as the Python runtime runs them
(`snapstart.run_before_snapshot()` / `run_after_restore()`: registration order
reversed, then in order), then more requests. What is checked is what a
restored instance must not share with the snapshot: its database connection
(a new backend, seen from the server), the model's SDK client, the token
verifier's cached key set (fetched again), the random state. The streaming
functions' server gets the same hooks over HTTP, as the Lambda Web Adapter
relays them.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from tests.api.test_auth import JwksServer, SigningKey, claims_for
from tests.handlers.conftest import (
    LambdaRuntime,
    body_of,
    http_event,
    token_for,
)
from tests.handlers.test_http import emf_records
from tests.handlers.test_stream import run_stream_server
from tests.utils.fake_openai import FakeOpenAI
from tests.utils.users import UserFactory

ROOT = Path(__file__).resolve().parents[2]
SECRET_MESSAGE = "the safe's code is 90210, keep it to yourself"


def snapstart(runtime: LambdaRuntime) -> types.ModuleType:
    """The module with the hooks, of the instance `runtime` imported (fresh for each test)."""
    runtime.load("chat")
    return sys.modules["memchat.snapstart"]


def state_of(runtime: LambdaRuntime) -> Any:
    return runtime.load("http").app.state.memchat


def turn(runtime: LambdaRuntime, token: str, message: str, **body: Any) -> dict[str, Any]:
    event = http_event("chat.json", token=token, body={"message": message, **body})
    response = runtime.invoke("chat", event)
    assert response["statusCode"] == 200, response
    return body_of(response)


def idle_connection(runtime: LambdaRuntime) -> psycopg.AsyncConnection[Any]:
    ((conn, _),) = state_of(runtime).db._idle
    return conn


def backend_alive(admin: psycopg.Connection, pid: int) -> bool:
    row = admin.execute("select count(*) from pg_stat_activity where pid = %s", (pid,)).fetchone()
    return row == (1,)


def wait_gone(admin: psycopg.Connection, pid: int, seconds: float = 5.0) -> bool:
    """Whether the server ended backend `pid` (it exits just after the client closed)."""
    deadline = time.monotonic() + seconds
    while backend_alive(admin, pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_the_handler_registers_its_hooks(lambda_: LambdaRuntime) -> None:
    hooks = snapstart(lambda_)
    app = lambda_.load("http").app
    before, after = hooks.registered_hooks()
    assert before == [(hooks.before_snapshot, (app,), {})]
    assert after == [(hooks.after_restore, (app,), {})]


def test_with_the_runtimes_library_the_hooks_are_registered_with_it(
    lambda_: LambdaRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Inside Lambda the Python runtime provides `snapshot_restore_py` and runs
    # what is registered with it; here a stand-in records the registrations.
    runtime_library = types.ModuleType("snapshot_restore_py")
    registered: dict[str, list[Any]] = {"before": [], "after": []}

    def register_before_snapshot(func: Any, *args: Any, **kwargs: Any) -> Any:
        registered["before"].append((func, args, kwargs))
        return func

    def register_after_restore(func: Any, *args: Any, **kwargs: Any) -> Any:
        registered["after"].append((func, args, kwargs))
        return func

    runtime_library.register_before_snapshot = register_before_snapshot  # type: ignore[attr-defined]
    runtime_library.register_after_restore = register_after_restore  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "snapshot_restore_py", runtime_library)

    hooks = snapstart(lambda_)
    app = lambda_.load("http").app
    assert registered["before"] == [(hooks.before_snapshot, (app,), {})]
    assert registered["after"] == [(hooks.after_restore, (app,), {})]


def test_after_restore_a_fresh_database_connection_is_made(
    lambda_: LambdaRuntime, users: UserFactory, admin: psycopg.Connection, model: FakeOpenAI
) -> None:
    hooks = snapstart(lambda_)
    token = token_for(users.create().user_id)
    session_id = turn(lambda_, token, SECRET_MESSAGE)["session_id"]
    before = idle_connection(lambda_)
    before_pid = before.info.backend_pid
    assert backend_alive(admin, before_pid)
    turn(lambda_, token, "and again", session_id=session_id)
    assert idle_connection(lambda_) is before  # a warm instance reuses it

    hooks.run_before_snapshot()
    # Nothing connected is left for the snapshot: the server ended the backend.
    assert state_of(lambda_).db._idle == []
    assert before.closed
    assert wait_gone(admin, before_pid)

    hooks.run_after_restore()
    answer = turn(lambda_, token, "what did I tell you?", session_id=session_id)
    assert SECRET_MESSAGE in json.dumps(model.requests[-1]["messages"])  # same data
    assert answer["session"]["message_count"] == 6
    after = idle_connection(lambda_)
    assert after is not before
    assert after.info.backend_pid != before_pid
    row = admin.execute(
        "select usename from pg_stat_activity where pid = %s", (after.info.backend_pid,)
    ).fetchone()
    assert row == ("memchat_api",)


def test_a_connection_left_at_restore_is_closed_not_reused(
    lambda_: LambdaRuntime, users: UserFactory, admin: psycopg.Connection, model: FakeOpenAI
) -> None:
    # Whatever the before-snapshot hook did, the after-restore hook alone never
    # lets a connection from before the snapshot serve a request.
    hooks = snapstart(lambda_)
    token = token_for(users.create().user_id)
    turn(lambda_, token, "hello")
    left = idle_connection(lambda_)
    left_pid = left.info.backend_pid

    hooks.run_after_restore()

    assert state_of(lambda_).db._idle == []
    assert left.closed
    assert wait_gone(admin, left_pid)
    turn(lambda_, token, "hello again")
    assert idle_connection(lambda_) is not left


def test_after_restore_the_model_client_is_new(
    lambda_: LambdaRuntime, users: UserFactory, model: FakeOpenAI
) -> None:
    hooks = snapstart(lambda_)
    token = token_for(users.create().user_id)
    turn(lambda_, token, "hello")
    state = state_of(lambda_)
    sdk_before = state.model._client
    assert sdk_before is not None

    hooks.run_before_snapshot()
    assert state.model._client is None  # closed: no pooled connection in the snapshot
    assert sdk_before._client.is_closed  # its HTTP client's pool
    hooks.run_after_restore()

    turn(lambda_, token, "hello again")
    assert state.model._client is not None and state.model._client is not sdk_before
    assert model.calls == 2


def test_after_restore_the_key_set_is_fetched_again(
    lambda_env: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
    lambda_: LambdaRuntime,
    users: UserFactory,
    model: FakeOpenAI,
) -> None:
    es256 = SigningKey("ES256")
    jwks = JwksServer()
    jwks.keys = [es256.jwk]
    try:
        monkeypatch.setenv("SUPABASE_URL", jwks.url)
        hooks = snapstart(lambda_)
        user_id = users.create().user_id
        token = es256.sign(claims_for(user_id, iss=f"{jwks.url}/auth/v1"))
        session_id = turn(lambda_, token, "one")["session_id"]
        turn(lambda_, token, "two", session_id=session_id)
        assert jwks.hits == 1  # cached for the warm instance

        hooks.run_before_snapshot()
        hooks.run_after_restore()

        turn(lambda_, token, "three", session_id=session_id)
        assert jwks.hits == 2  # the restored instance fetched its own
        turn(lambda_, token, "four", session_id=session_id)
        assert jwks.hits == 2
    finally:
        jwks.close()


def test_after_restore_random_is_reseeded(lambda_: LambdaRuntime) -> None:
    hooks = snapstart(lambda_)
    hooks.run_before_snapshot()
    snapshot = random.getstate()

    # Two instances restored from one snapshot: the same state, then the hook.
    hooks.run_after_restore()
    first = [random.random() for _ in range(4)]
    random.setstate(snapshot)
    hooks.run_after_restore()
    second = [random.random() for _ in range(4)]
    random.setstate(snapshot)
    without_hook = [random.random() for _ in range(4)]
    random.setstate(snapshot)
    assert without_hook == [random.random() for _ in range(4)]  # what it would share

    assert first != second
    assert without_hook not in (first, second)


def test_snapshot_then_restore_then_the_first_request(
    lambda_: LambdaRuntime, users: UserFactory, admin: psycopg.Connection, model: FakeOpenAI, capsys
) -> None:
    # As Lambda runs a SnapStart version: init (the import), before-snapshot,
    # [snapshot], after-restore in a new instance, then its first invocation.
    hooks = snapstart(lambda_)
    state = state_of(lambda_)
    hooks.run_before_snapshot()
    assert state.db._idle == []
    assert state.model._client is None
    warm_up = [
        r
        for r in lambda_.log_records()
        if r.get("client_request_id") == "snapstart-warm-up" and "status" in r
    ]
    # One refused request without a token, one with a malformed one, /health.
    assert sorted(r.get("status") for r in warm_up) == [200, 401, 401]
    assert model.calls == 0  # the warm-up calls no model and stores nothing

    hooks.run_after_restore()
    token = token_for(users.create().user_id)
    event = http_event("chat.json", token=token, body={"message": SECRET_MESSAGE})
    response = lambda_.invoke("chat", event)
    assert response["statusCode"] == 200, response
    assert body_of(response)["answer"] == f"echo: {SECRET_MESSAGE}"

    # The warm-up was not the instance's cold start: the first invocation is.
    cold = [m for m in emf_records(capsys.readouterr().out) if "ColdStart" in m]
    assert len(cold) == 1
    messages = [r.get("message") for r in lambda_.log_records()]
    assert "warmed for the SnapStart snapshot: connections closed, heap frozen" in messages
    assert "restored from a SnapStart snapshot: connections and clients reset" in messages
    logged = lambda_.logs.getvalue()
    assert "90210" not in logged and token not in logged and "not-a-token" not in logged


def chat_function_env(database_url: str, model: FakeOpenAI) -> dict[str, str]:
    """The chat function's environment for a fresh interpreter (this checkout's modules)."""
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.endswith(("_SECRET_ARN", "_PARAMETER"))
        and not name.startswith(("POWERTOOLS_", "OPENAI_", "AWS_"))
        and name not in {"SUPABASE_URL", "ROUTE_GROUPS", "MEMORY_ENABLED"}
    }
    env.update(
        {
            "DATABASE_URL": database_url,
            "SUPABASE_JWT_SECRET": "test-jwt-secret-with-at-least-32-characters",
            "OPENAI_API_KEY": "test-key",
            "OPENAI_BASE_URL": model.url,
            "OPENAI_MODEL": "gpt-4o-mini",  # a model with a real tokenizer
            "ROUTE_GROUPS": "chat",
            "POWERTOOLS_TRACE_DISABLED": "true",
            "AWS_LAMBDA_FUNCTION_NAME": "memchat-ChatFunction",
            "AWS_REGION": "eu-west-1",
            "PYTHONPATH": os.pathsep.join(
                [str(ROOT / "functions"), *filter(None, [os.environ.get("PYTHONPATH")])]
            ),
        }
    )
    return env


def run_in_chat_function(script: str, database_url: str, model: FakeOpenAI) -> Any:
    """`script` run by a fresh interpreter in the chat function's environment:
    the JSON its last line prints."""
    done = subprocess.run(
        [sys.executable, "-c", script],
        env=chat_function_env(database_url, model),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_import_leaves_to_first_use_what_the_snapshot_warms(
    database_url: str, model: FakeOpenAI
) -> None:
    """In a fresh interpreter: importing the chat handler does not import PyJWT or
    the openai SDK nor build the tokenizer, nor the routes it serves on demand
    (/v1, /memory/search, /mcp); the before-snapshot hook does all of them
    (its warm-up requests included) and never imports pydantic.v1. The init
    phase freezes what it made (gc.freeze), and the hook freezes the rest
    after its warm-up, its garbage collected first."""
    script = """
import gc, json, sys
import memchat.handlers.chat
from memchat import snapstart
from memchat.model import tokens
seen = {}
def look(when):
    seen[when] = {
        "jwt": "jwt" in sys.modules,
        "openai": "openai" in sys.modules,
        "tokenizer": bool(tokens._counters),
        "pydantic.v1": sys.modules.get("pydantic.v1") is not None,
        "pydantic_settings": "pydantic_settings" in sys.modules,
        "on demand": sorted(m for m in ON_DEMAND if m in sys.modules),
        "frozen": gc.get_freeze_count(),
        "tracked": len(gc.get_objects()),
    }
ON_DEMAND = [f"memchat.api.routes.{name}" for name in ("completions", "search", "mcp")]
look("import")
snapstart.run_before_snapshot()
look("snapshot")
print(json.dumps(seen))
"""
    seen = run_in_chat_function(script, database_url, model)
    # Neither is ever imported: FastAPI's pydantic v1 check is told there is
    # none, and the settings are a plain pydantic model (docs/benchmarks.md).
    # Frozen: everything the import made, then everything the warm-up left.
    imported, snapshot = seen["import"], seen["snapshot"]
    frozen_at_import = imported.pop("frozen")
    assert frozen_at_import > 10_000 and imported.pop("tracked") < 1_000
    assert snapshot.pop("frozen") > frozen_at_import and snapshot.pop("tracked") < 1_000
    unused = {"pydantic.v1": False, "pydantic_settings": False}
    on_demand = sorted(f"memchat.api.routes.{name}" for name in ("completions", "mcp", "search"))
    assert seen["import"] == {
        "jwt": False, "openai": False, "tokenizer": False, "on demand": [], **unused
    }  # fmt: skip
    assert seen["snapshot"] == {
        "jwt": True, "openai": True, "tokenizer": True, "on demand": on_demand, **unused
    }  # fmt: skip


def test_the_init_phase_builds_the_app_with_the_collector_off_then_on_again(
    database_url: str, model: FakeOpenAI
) -> None:
    """The app is built with automatic garbage collection off (what it makes
    lives as long as the instance), and collection is on again once the init
    phase is over, and also when it fails (a misconfigured function)."""
    script = """
import gc, json
from memchat import bootstrap
from memchat.config import ConfigError
build = bootstrap.app
seen = {}
def app(*args, **kwargs):
    seen["collecting while built"] = gc.isenabled()
    return build(*args, **kwargs)
bootstrap.app = app
import memchat.handlers.chat
seen["collecting after"] = gc.isenabled()
import os
os.environ["EMBEDDING_DIMENSIONS"] = "-1"
try:
    bootstrap.lambda_app()
except ConfigError:
    seen["collecting after a failed start"] = gc.isenabled()
print(json.dumps(seen))
"""
    assert run_in_chat_function(script, database_url, model) == {
        "collecting while built": False,
        "collecting after": True,
        "collecting after a failed start": True,
    }


def test_the_stream_server_takes_the_adapters_hooks(
    database_url: str, model: FakeOpenAI, users: UserFactory, tmp_path: Path
) -> None:
    env = {
        "DATABASE_URL": database_url,
        "OPENAI_API_KEY": "test-key",
        "OPENAI_BASE_URL": model.url,
        "OPENAI_MODEL": "fake-model",
        "OPENAI_MAX_RETRIES": "0",
    }
    with run_stream_server("chat", env, tmp_path / "stream.log") as server:
        token = token_for(users.create().user_id)
        auth = {"Authorization": f"Bearer {token}"}
        with httpx.Client(base_url=server.url, timeout=30) as client:
            # Relayed from the function URL (the adapter stamps its context): unknown.
            for path in ("/_snapstart/before-checkpoint", "/_snapstart/after-restore"):
                relayed = client.post(path, headers={"x-amzn-request-context": "{}"})
                assert relayed.status_code == 404, relayed.text
                assert relayed.json()["error"] == "not_found"
            assert client.get("/_snapstart/after-restore").status_code == 404

            first = client.post("/chat", json={"message": "hello"}, headers=auth)
            assert first.status_code == 200, first.text

            before = client.post("/_snapstart/before-checkpoint")
            assert before.status_code == 204, before.text
            after = client.post("/_snapstart/after-restore")
            assert after.status_code == 204, after.text

            # What the adapter does next: the readiness check, then the traffic.
            assert client.get("/health").json() == {"status": "ok", "database": "ok"}
            again = client.post(
                "/chat",
                json={"message": "hello again", "session_id": first.json()["session_id"]},
                headers=auth,
            )
            assert again.status_code == 200, again.text
            assert again.json()["session"]["message_count"] == 4
        output = server.output()
        assert "warmed for the SnapStart snapshot: connections closed" in output
        assert "restored from a SnapStart snapshot: connections and clients reset" in output
        assert token not in output


@pytest.mark.parametrize("path", ["/_snapstart/before-checkpoint", "/_snapstart/after-restore"])
def test_the_hook_paths_are_not_routes_of_the_api(lambda_: LambdaRuntime, path: str) -> None:
    # Behind API Gateway the hooks are the runtime's, never HTTP: a 404 like any other.
    event = http_event("chat.json", path=path, body={})
    event["routeKey"] = f"POST {path}"
    response = lambda_.invoke("chat", event)
    assert response["statusCode"] == 404
    assert body_of(response)["error"] == "not_found"
