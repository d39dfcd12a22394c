"""Feedback and stats under row-level security (supabase/schemas/functions/stats.sql).

As the API runs a request (`memchat_user` with B's claims), B can neither
see, change, take over nor plant feedback on A's answers, and B's stats
never count A's rows; through the Data API (`authenticated`) and as `anon`
neither feedback nor stats are reachable at all.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from tests.store.conftest import World, affected, refused
from tests.utils.store_data import acting_as, through_data_api


def answer_of(admin: psycopg.Connection, session: Any) -> int:
    row = admin.execute(
        "select max(id) from public.chat_message_history"
        " where session_id = %s and message->>'type' = 'ai'",
        (session,),
    ).fetchone()
    assert row is not None and row[0] is not None
    return int(row[0])


@pytest.fixture
def rated(admin: psycopg.Connection, world: World) -> Iterator[dict[str, Any]]:
    """A's answer rated by A, and the ids the statements below need."""
    a_answer = answer_of(admin, world.a_session)
    admin.execute(
        "insert into memchat.message_feedback"
        " (message_id, user_id, session_id, agent_name, rating, comment)"
        " values (%s, %s, %s, 'default', 1, 'mine')",
        (a_answer, world.a.user_id, world.a_session),
    )
    yield {**world.params, "a_answer": a_answer, "b_answer": answer_of(admin, world.b_session)}


def a_feedback(admin: psycopg.Connection, world: World) -> list[tuple[Any, ...]]:
    return admin.execute(
        "select message_id, user_id, rating, comment from memchat.message_feedback"
        " where user_id = %s",
        (world.a.user_id,),
    ).fetchall()


def test_b_cannot_see_change_or_take_over_as_feedback(
    conn: psycopg.Connection, admin: psycopg.Connection, world: World, rated: dict[str, Any]
) -> None:
    before = a_feedback(admin, world)
    with acting_as(conn, world.b.claims):
        (seen,) = conn.execute("select count(*) from memchat.message_feedback").fetchone() or (0,)
        assert seen == 0
        for statement in (
            "update memchat.message_feedback set rating = -1",
            "update memchat.message_feedback set user_id = %(b)s where user_id = %(a)s",
            "delete from memchat.message_feedback",
        ):
            assert affected(conn, statement, rated) in (0, "refused"), statement
        # Planting: a row owned by A, or a row of B's on A's answer.
        for statement in (
            "insert into memchat.message_feedback"
            " (message_id, user_id, session_id, agent_name, rating)"
            " values (%(b_answer)s, %(a)s, %(b_session)s, 'default', -1)",
            "insert into memchat.message_feedback"
            " (message_id, user_id, session_id, agent_name, rating)"
            " values (%(a_answer)s, %(b)s, %(a_session)s, 'default', -1)",
            "insert into memchat.message_feedback"
            " (message_id, user_id, session_id, agent_name, rating)"
            " values (%(a_answer)s, %(b)s, %(b_session)s, 'default', -1)",
        ):
            assert refused(conn, statement, rated), statement
        stats = conn.execute("select memchat.chat_stats(%s, null)", (world.b.user_id,)).fetchone()
        one = conn.execute(
            "select memchat.session_stats(%s, %s)", (world.b.user_id, world.a_session)
        ).fetchone()
        # Naming A as the caller is refused, whatever A has.
        for statement in (
            "select memchat.chat_stats(%(a)s, null)",
            "select memchat.session_stats(%(a)s, %(a_session)s)",
        ):
            assert refused(conn, statement, rated), statement
    assert a_feedback(admin, world) == before
    assert stats is not None and stats[0]["feedback"]["positive"] == 0
    assert stats[0]["sessions"]["total"] == 1  # B's own
    assert one == (None,)


def test_a_sees_and_counts_its_own(
    conn: psycopg.Connection, world: World, rated: dict[str, Any]
) -> None:
    with acting_as(conn, world.a.claims):
        rows = conn.execute("select message_id from memchat.message_feedback").fetchall()
        stats = conn.execute("select memchat.chat_stats(%s, null)", (world.a.user_id,)).fetchone()
    assert rows == [(rated["a_answer"],)]
    assert stats is not None and stats[0]["feedback"]["positive"] == 1


@pytest.mark.parametrize(
    "statement",
    [
        "select * from memchat.message_feedback",
        "insert into memchat.message_feedback (message_id, user_id, session_id, agent_name,"
        " rating) values (%(a_answer)s, %(a)s, %(a_session)s, 'default', 1)",
        "select memchat.chat_stats(%(a)s, null)",
        "select memchat.session_stats(%(a)s, %(a_session)s)",
        "select * from memchat_analytics.turns",
        "select * from memchat_analytics.daily_usage",
    ],
)
def test_the_data_api_and_anon_reach_neither_feedback_nor_stats(
    gateway: psycopg.Connection, world: World, rated: dict[str, Any], statement: str
) -> None:
    with through_data_api(gateway, world.a.claims):
        assert refused(gateway, statement, rated)
    with acting_as(gateway, None):
        assert refused(gateway, statement, rated)
