"""The scheduled cleanup function invoked with an EventBridge Scheduler event."""

from __future__ import annotations

import json
import uuid

import psycopg
import pytest

from memchat import messages
from tests.cleanup.test_cleanup import CONTRACT
from tests.handlers.conftest import FakeContext, LambdaRuntime, load_event
from tests.utils.users import UserFactory

CONTRACT_KEYS = CONTRACT  # the cleanup's result (docs/api.md, "Scheduled cleanup")


def expired_session(admin: psycopg.Connection, users: UserFactory) -> uuid.UUID:
    """A session that expired an hour ago, with two messages."""
    caller = users.create()
    session_id = uuid.uuid4()
    admin.execute(
        "insert into public.chat_sessions (id, user_id, agent_name, expires_at, last_active_at)"
        " values (%s, %s, 'default', now() - interval '1 hour', now() - interval '8 days')",
        (session_id, caller.user_id),
    )
    for message in (messages.human("old question"), messages.ai("old answer")):
        admin.execute(
            "insert into public.chat_message_history (session_id, user_id, message)"
            " values (%s, %s, %s::jsonb)",
            (session_id, caller.user_id, json.dumps(message)),
        )
    return session_id


def rows(admin: psycopg.Connection, session_id: uuid.UUID) -> tuple[int, int]:
    sessions = admin.execute(
        "select count(*) from public.chat_sessions where id = %s", (session_id,)
    ).fetchone()
    stored = admin.execute(
        "select count(*) from public.chat_message_history where session_id = %s", (session_id,)
    ).fetchone()
    assert sessions is not None and stored is not None
    return sessions[0], stored[0]


def cleanup_context(remaining_ms: int = 300_000) -> FakeContext:
    return FakeContext(
        function_name="memchat-CleanupFunction-9Z8y7X6w5V4u",
        memory_limit_in_mb=512,
        remaining_ms=remaining_ms,
    )


def test_cleanup_deletes_expired_sessions_and_their_messages(
    lambda_: LambdaRuntime, admin: psycopg.Connection, users: UserFactory, capsys
) -> None:
    session_id = expired_session(admin, users)
    live = users.create()
    live_id = uuid.uuid4()
    admin.execute(
        "insert into public.chat_sessions (id, user_id, agent_name) values (%s, %s, 'default')",
        (live_id, live.user_id),
    )

    result = lambda_.invoke("cleanup", load_event("cleanup.json"), cleanup_context())

    assert set(result) == CONTRACT_KEYS
    assert result["deleted_sessions"] >= 1 and result["deleted_messages"] >= 2
    assert result["batches"] >= 1 and result["finished"] is True
    assert rows(admin, session_id) == (0, 0)
    assert rows(admin, live_id) == (1, 0)

    logged = [r for r in lambda_.log_records() if "cleanup" in r]
    assert logged and set(logged[-1]["cleanup"]) == CONTRACT_KEYS
    assert logged[-1]["correlation_id"] == load_event("cleanup.json")["execution_id"]
    (metrics,) = [
        json.loads(line)
        for line in capsys.readouterr().out.splitlines()
        if "DeletedSessions" in line
    ]
    assert metrics["DeletedSessions"][0] >= 1 and metrics["CleanupUnfinished"] == [0.0]


def test_dry_run_only_counts(
    lambda_: LambdaRuntime, admin: psycopg.Connection, users: UserFactory
) -> None:
    session_id = expired_session(admin, users)
    event = {**load_event("cleanup.json"), "dry_run": True}

    result = lambda_.invoke("cleanup", event, cleanup_context())

    assert set(result) == CONTRACT_KEYS | {"dry_run"} and result["dry_run"] is True
    assert result["deleted_sessions"] >= 1
    assert rows(admin, session_id) == (1, 2)
    lambda_.invoke("cleanup", load_event("cleanup.json"), cleanup_context())
    assert rows(admin, session_id) == (0, 0)


def test_the_time_budget_comes_from_the_context(
    lambda_: LambdaRuntime, admin: psycopg.Connection, users: UserFactory
) -> None:
    session_id = expired_session(admin, users)

    # Less time left than the reserve kept to return in: no batch is started.
    result = lambda_.invoke("cleanup", load_event("cleanup.json"), cleanup_context(1_000))

    assert result["batches"] == 0 and result["finished"] is False
    assert rows(admin, session_id) == (1, 2)
    lambda_.invoke("cleanup", load_event("cleanup.json"), cleanup_context())


def test_empty_scheduler_input(lambda_: LambdaRuntime) -> None:
    result = lambda_.invoke("cleanup", {}, cleanup_context())
    assert set(result) == CONTRACT_KEYS


def test_needs_only_the_database_url(
    lambda_: LambdaRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("OPENAI_API_KEY", "SUPABASE_JWT_SECRET"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("CLEANUP_BATCH_SIZE", "50")
    monkeypatch.setenv("CLEANUP_PAUSE_FACTOR", "0.5")
    module = lambda_.load("cleanup")
    assert (module.cleanup.batch_size, module.cleanup.pause_factor) == (50, 0.5)
    assert module.settings.openai_api_key is None and module.settings.supabase_jwt_secret is None


@pytest.mark.parametrize("value", ["0", "-1", "many", "100001"])
def test_bad_batch_size_fails_the_init_phase(
    lambda_: LambdaRuntime, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    from memchat.config import ConfigError

    monkeypatch.setenv("CLEANUP_BATCH_SIZE", value)
    with pytest.raises(ConfigError, match="CLEANUP_BATCH_SIZE"):
        lambda_.load("cleanup")


def test_missing_database_url_fails_the_init_phase(
    lambda_: LambdaRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    from memchat.config import ConfigError

    monkeypatch.delenv("DATABASE_URL")
    with pytest.raises(ConfigError, match="DATABASE_URL"):
        lambda_.load("cleanup")
