"""The cleanup use case against the real PostgreSQL: what goes, what stays, budgets."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

import pytest

from memchat import bootstrap
from memchat.config import ConfigError, load_settings
from memchat.usecases.cleanup import Cleanup, CleanupResult, TimeBudget
from tests.cleanup.conftest import HOUR, Seeder, cleanup_on

CONTRACT = {
    "deleted_sessions",
    "deleted_messages",
    "deleted_memories",
    "batches",
    "duration_ms",
    "finished",
}


class StepClock:
    """A monotonic clock that moves one second every time it is read."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def test_deletes_expired_sessions_with_messages_and_pointers_keeps_the_rest(
    cleanup_url, users, seed: Seeder
):
    alice, bob = users.create(), users.create()
    expired = seed.session(alice.user_id, messages=4, agent_name="default", active=True)
    live = seed.session(alice.user_id, expires_in=HOUR, messages=3, agent_name="other", active=True)
    seed.notes(alice.user_id, "default", "# Name\nAlice")
    bob_expired = seed.session(bob.user_id, expires_in=-timedelta(seconds=1), messages=2)
    bob_live = seed.session(bob.user_id, expires_in=timedelta(minutes=1), messages=1)

    result = cleanup_on(cleanup_url, batch_size=1000).run()

    assert result.finished and result.batches >= 1
    assert result.deleted_sessions >= 2 and result.deleted_messages >= 6
    assert not seed.exists(expired) and not seed.exists(bob_expired)
    assert seed.message_count(expired) == 0 and seed.message_count(bob_expired) == 0
    # The pointer to the deleted session went with it (FK cascade); the other stays.
    assert seed.pointer(alice.user_id, "default") is None
    assert seed.pointer(alice.user_id, "other") == live
    # Live sessions and their messages are untouched.
    assert seed.exists(live) and seed.message_count(live) == 3
    assert seed.exists(bob_live) and seed.message_count(bob_live) == 1
    # Long-term notes are not session data: kept.
    row = seed.admin.execute(
        "select notes, version from public.agent_long_term_memory"
        " where user_id = %s and agent_name = 'default'",
        (alice.user_id,),
    ).fetchone()
    assert row == ("# Name\nAlice", 1)

    again = cleanup_on(cleanup_url, batch_size=1000).run()  # idempotent
    assert again.finished
    assert seed.user_sessions(alice.user_id) == 1 and seed.user_messages(alice.user_id) == 3


def test_works_in_batches_of_batch_size(cleanup_url, users, seed: Seeder):
    user = users.create()
    mine = [seed.session(user.user_id, messages=2) for _ in range(5)]
    sessions, messages = _expired_now(seed)

    result = cleanup_on(cleanup_url, batch_size=2).run()

    # Full batches until a short one (possibly empty) says nothing is left.
    assert result.batches == sessions // 2 + 1
    assert (result.deleted_sessions, result.deleted_messages) == (sessions, messages)
    assert result.finished
    assert not any(seed.exists(sid) for sid in mine)


def test_dry_run_counts_and_deletes_nothing(cleanup_url, users, seed: Seeder):
    user = users.create()
    mine = [seed.session(user.user_id, messages=3) for _ in range(2)]
    sessions, messages = _expired_now(seed)

    result = cleanup_on(cleanup_url, batch_size=1).dry_run()

    assert (result.deleted_sessions, result.deleted_messages) == (sessions, messages)
    assert result.dry_run and result.finished and result.batches == 0
    assert result.as_dict()["dry_run"] is True
    assert all(seed.exists(sid) and seed.message_count(sid) == 3 for sid in mine)

    cleanup_on(cleanup_url, batch_size=1000).run()
    assert not any(seed.exists(sid) for sid in mine)


def test_stopped_by_its_budget_resumes_on_the_next_run(cleanup_url, users, seed: Seeder):
    user = users.create()
    # Expired long before anything other tests create: the first in line.
    oldest = datetime(1971, 1, 1, tzinfo=UTC)
    mine = [
        seed.session(user.user_id, expires_at=oldest + timedelta(minutes=i), messages=2)
        for i in range(5)
    ]

    # Every clock read takes a second: each batch "takes" 1 s (3 rows), the
    # pause after it 0.8 s (the factor eases off from 1: nothing slowed the
    # batch). After the second batch 2 s are left: less than the pause plus
    # 3x the slowest batch, so the run stops there rather than sleep.
    pauses: list[float] = []
    first = cleanup_on(
        cleanup_url,
        batch_size=1,
        clock=StepClock(),
        sleep=pauses.append,
        probe=False,  # paced by the batches alone: the StepClock's
    ).run(TimeBudget(max_seconds=10))

    assert not first.finished
    assert (first.batches, first.deleted_sessions, first.deleted_messages) == (2, 2, 4)
    assert first.duration_ms == 9000
    assert pauses == [pytest.approx(0.8)]
    assert [seed.exists(sid) for sid in mine] == [False, False, True, True, True]

    second = cleanup_on(cleanup_url, batch_size=1).run(TimeBudget(max_seconds=600))

    assert second.finished and second.deleted_sessions >= 3
    assert not any(seed.exists(sid) for sid in mine)


def test_lambda_remaining_time_is_the_budget(cleanup_url, users, seed: Seeder):
    user = users.create()
    sid = seed.session(user.user_id, messages=1)

    # Less than the reserve the Lambda keeps to return: not a single batch.
    starved = cleanup_on(cleanup_url, batch_size=1000).run(TimeBudget(remaining_ms=lambda: 1500))
    assert (starved.batches, starved.deleted_sessions, starved.finished) == (0, 0, False)
    assert seed.exists(sid)

    ample = cleanup_on(cleanup_url, batch_size=1000).run(TimeBudget(remaining_ms=lambda: 60_000))
    assert ample.finished and not seed.exists(sid)


def test_a_zero_budget_deletes_nothing(cleanup_url, users, seed: Seeder):
    user = users.create()
    sid = seed.session(user.user_id, messages=1)
    result = cleanup_on(cleanup_url, batch_size=1000).run(TimeBudget(max_seconds=0))
    assert (result.batches, result.finished) == (0, False) and seed.exists(sid)
    cleanup_on(cleanup_url, batch_size=1000).run()
    assert not seed.exists(sid)


def test_logs_one_line_with_the_result(cleanup_url, caplog):
    with caplog.at_level(logging.INFO, logger="memchat.usecases.cleanup"):
        result = cleanup_on(cleanup_url, batch_size=1000).run()
    lines = [r for r in caplog.records if r.name == "memchat.usecases.cleanup"]
    assert len(lines) == 1
    assert lines[0].getMessage().startswith("cleanup {")
    assert lines[0].cleanup == result.as_dict()


def test_result_contract():
    result = CleanupResult(3, 40, 2, 12.345, True)
    assert result.as_dict() == {
        "deleted_sessions": 3,
        "deleted_messages": 40,
        "deleted_memories": 0,
        "batches": 2,
        "duration_ms": 12.3,
        "finished": True,
    }
    assert set(result.as_dict()) == CONTRACT
    dry = CleanupResult(1, 2, 0, 1.0, True, dry_run=True)
    assert set(dry.as_dict()) == CONTRACT | {"dry_run"}


def test_batch_size_must_be_positive_and_the_pause_factor_not_negative(cleanup_url):
    with pytest.raises(ValueError, match="batch_size"):
        Cleanup(cleanup_url, batch_size=0, pause_factor=1.0)
    with pytest.raises(ValueError, match="pause factor"):
        Cleanup(cleanup_url, batch_size=1, pause_factor=-1.0)


def _expired_now(seed: Seeder) -> tuple[int, int]:
    """What a run would delete now, across the whole database."""
    row = seed.admin.execute(
        "select (select count(*) from public.chat_sessions where expires_at <= now()),"
        " (select count(*) from public.chat_message_history h"
        "   join public.chat_sessions s on s.id = h.session_id and s.user_id = h.user_id"
        "  where s.expires_at <= now())"
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def test_pauses_between_batches_in_proportion_to_each_batch(cleanup_url, users, seed: Seeder):
    for _ in range(5):
        seed.session(users.create().user_id, messages=2)
    pauses: list[float] = []
    # A fixed factor (not adaptive): each pause is exactly 2x its batch, 1 s here.
    result = cleanup_on(
        cleanup_url,
        batch_size=2,
        pause_factor=2.0,
        adaptive=False,
        clock=StepClock(),
        sleep=pauses.append,
    ).run()
    assert result.finished and result.batches >= 3
    # No pause after the last (short) batch: nothing is left to throttle.
    assert pauses == [2.0] * (result.batches - 1)

    for _ in range(5):
        seed.session(users.create().user_id, messages=2)
    adaptive: list[float] = []
    result = cleanup_on(cleanup_url, batch_size=2, pause_factor=2.0, sleep=adaptive.append).run()
    assert result.finished and result.batches >= 3
    assert len(adaptive) == result.batches - 1
    assert all(p > 0 for p in adaptive)

    for _ in range(3):
        seed.session(users.create().user_id, messages=1)
    unthrottled: list[float] = []
    cleanup_on(cleanup_url, batch_size=1, pause_factor=0, sleep=unthrottled.append).run()
    assert unthrottled == []


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, (1000, 1.0)),
        ({"CLEANUP_BATCH_SIZE": "200", "CLEANUP_PAUSE_FACTOR": "0.5"}, (200, 0.5)),
        ({"CLEANUP_PAUSE_FACTOR": "0"}, (1000, 0.0)),
    ],
)
def test_configured_by_the_settings(monkeypatch, env, expected):
    configured = bootstrap.cleanup(_settings(monkeypatch, env))
    assert (configured.batch_size, configured.pause_factor) == expected
    assert configured.conninfo == "postgresql://localhost/memchat"


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"CLEANUP_BATCH_SIZE": "0"}, "CLEANUP_BATCH_SIZE"),
        ({"CLEANUP_BATCH_SIZE": "lots"}, "CLEANUP_BATCH_SIZE"),
        ({"CLEANUP_PAUSE_FACTOR": "-1"}, "CLEANUP_PAUSE_FACTOR"),
        ({"CLEANUP_PAUSE_FACTOR": "fast"}, "CLEANUP_PAUSE_FACTOR"),
    ],
)
def test_bad_settings_name_the_variable(monkeypatch, env, named):
    with pytest.raises(ConfigError, match=named):
        _settings(monkeypatch, env)


def _settings(monkeypatch, env: dict[str, str]):
    """The cleanup function's settings (its DATABASE_URL alone, no token or model settings)."""
    for name in (
        "CLEANUP_BATCH_SIZE",
        "CLEANUP_PAUSE_FACTOR",
        "SUPABASE_JWT_SECRET",
        "SUPABASE_URL",
        "OPENAI_API_KEY",
    ):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return load_settings(job="cleanup", database_url="postgresql://localhost/memchat")
