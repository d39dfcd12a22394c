"""A message's embedding and feedback go with it (supabase/schemas/triggers.sql).

No foreign key ties them to their message any more (a foreign key runs a
query per deleted message; the cleanup deletes them by the hundred
thousand): a statement-level trigger deletes them with their messages, and
a row-level trigger keeps the foreign key's promises on insert. Here: every
way a message is deleted takes its embedding and feedback with it, and only
its own; a rating of no message is refused with the foreign key's error;
and a rating racing a delete of its answer never leaves a rating of
nothing behind, whichever comes first.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest

from memchat import store
from tests.store.conftest import World
from tests.utils.store_data import acting_as, set_local_on_citus, through_data_api

VECTOR = "array_fill(0.25::real, array[512])::extensions.vector"


@dataclass(frozen=True)
class Dependents:
    """One user's embedded question and rated answer."""

    question: int
    answer: int

    @property
    def ids(self) -> list[int]:
        return [self.question, self.answer]


def message_ids(admin: psycopg.Connection, session: uuid.UUID) -> Dependents:
    rows = admin.execute(
        "select message->>'type', id from public.chat_message_history where session_id = %s",
        (session,),
    ).fetchall()
    kinds = dict(rows)
    return Dependents(question=int(kinds["human"]), answer=int(kinds["ai"]))


def add_dependents(admin: psycopg.Connection, user: uuid.UUID, session: uuid.UUID) -> Dependents:
    ids = message_ids(admin, session)
    admin.execute(
        "insert into memchat.message_embeddings"
        f" (message_id, user_id, session_id, agent_name, created_at, embedding)"
        f" values (%s, %s, %s, 'default', now(), {VECTOR})",
        (ids.question, user, session),
    )
    admin.execute(
        "insert into memchat.message_feedback (message_id, user_id, session_id, agent_name, rating)"
        " values (%s, %s, %s, 'default', 1)",
        (ids.answer, user, session),
    )
    admin.execute(
        "insert into memchat.message_facts"
        " (message_id, ordinal, user_id, session_id, agent_name, created_at, model, embedding)"
        f" values (%s, 0, %s, %s, 'default', now(), 'm', {VECTOR})",
        (ids.question, user, session),
    )
    return ids


def counts(admin: psycopg.Connection, ids: Dependents) -> tuple[int, int, int]:
    """(embeddings, ratings, fact keys) of the exchange."""
    row = admin.execute(
        "select (select count(*) from memchat.message_embeddings where message_id = %(q)s),"
        "       (select count(*) from memchat.message_feedback where message_id = %(a)s),"
        "       (select count(*) from memchat.message_facts where message_id = %(q)s)",
        {"q": ids.question, "a": ids.answer},
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1]), int(row[2])


@pytest.fixture
def both(admin: psycopg.Connection, world: World) -> tuple[Dependents, Dependents]:
    """A's and B's embedded question and rated answer."""
    return (
        add_dependents(admin, world.a.user_id, world.a_session),
        add_dependents(admin, world.b.user_id, world.b_session),
    )


def api_clears(conn: psycopg.Connection, gateway: psycopg.Connection, world: World) -> None:
    with acting_as(conn, world.a.claims):
        conn.execute(
            "delete from public.chat_message_history where session_id = %s", (world.a_session,)
        )


def data_api_deletes_the_session(
    conn: psycopg.Connection, gateway: psycopg.Connection, world: World
) -> None:
    with through_data_api(gateway, world.a.claims):
        gateway.execute("delete from public.chat_sessions where id = %s", (world.a_session,))


def the_user_is_deleted(
    conn: psycopg.Connection, gateway: psycopg.Connection, world: World
) -> None:
    gateway.execute("delete from auth.users where id = %s", (world.a.user_id,))


Deleter = Callable[[psycopg.Connection, psycopg.Connection, World], None]
DELETERS: list[Any] = [
    pytest.param(api_clears, id="the API clears the session"),
    pytest.param(
        data_api_deletes_the_session,
        id="the Data API deletes the session (its messages by cascade)",
        marks=pytest.mark.data_api,
    ),
    pytest.param(
        the_user_is_deleted, id="the user is deleted (sessions, then messages, by cascade)"
    ),
]


@pytest.mark.parametrize("deleter", DELETERS)
def test_every_deleter_takes_the_embedding_and_feedback_along(
    deleter: Deleter,
    conn: psycopg.Connection,
    gateway: psycopg.Connection,
    admin: psycopg.Connection,
    world: World,
    both: tuple[Dependents, Dependents],
) -> None:
    a, b = both
    assert counts(admin, a) == (1, 1, 1)
    deleter(conn, gateway, world)
    assert counts(admin, a) == (0, 0, 0)
    assert counts(admin, b) == (1, 1, 1)  # only the deleted messages' own


def test_the_ttl_cleanup_takes_them_along(
    cleanup_url: str, admin: psycopg.Connection, world: World, both: tuple[Dependents, Dependents]
) -> None:
    a, b = both
    admin.execute(
        "update public.chat_sessions set expires_at = now() - interval '1 minute' where id = %s",
        (world.a_session,),
    )
    with psycopg.connect(cleanup_url, autocommit=True) as cleanup:
        while store.expire_sessions_batch(cleanup, 1000, 365)[0]:
            pass
    assert counts(admin, a) == (0, 0, 0)
    assert counts(admin, b) == (1, 1, 1)


@pytest.mark.plain_only  # its truncate trigger (Citus: no truncate trigger, docs/deploy.md)
def test_truncating_the_messages_truncates_them(
    admin_url: str, world: World, both: tuple[Dependents, Dependents]
) -> None:
    a, b = both
    with psycopg.connect(admin_url) as owner:  # one transaction, rolled back: others' rows stay
        owner.execute("truncate public.chat_message_history")
        assert counts(owner, a) == (0, 0, 0) and counts(owner, b) == (0, 0, 0)
        owner.rollback()
        assert counts(owner, a) == (1, 1, 1)
        # With cascade, which truncates the feedback (it references the
        # sessions) in the same statement before the trigger runs.
        owner.execute("truncate public.chat_message_history, public.chat_sessions cascade")
        assert counts(owner, a) == (0, 0, 0) and counts(owner, b) == (0, 0, 0)
        owner.rollback()
        assert counts(owner, a) == (1, 1, 1)


@pytest.mark.parametrize(
    "statement",
    [
        "insert into memchat.message_embeddings"
        " (message_id, user_id, session_id, agent_name, created_at, embedding)"
        f" values (-1, %(user)s, %(session)s, 'default', now(), {VECTOR})",
        "insert into memchat.message_feedback (message_id, user_id, session_id, agent_name, rating)"
        " values (-1, %(user)s, %(session)s, 'default', 1)",
        "update memchat.message_feedback set message_id = -1 where message_id = %(answer)s",
        "update memchat.message_embeddings set message_id = -1 where message_id = %(question)s",
        "insert into memchat.message_facts"
        " (message_id, ordinal, user_id, session_id, agent_name, created_at, model, embedding)"
        f" values (-1, 0, %(user)s, %(session)s, 'default', now(), 'm', {VECTOR})",
    ],
    ids=["embedding insert", "feedback insert", "feedback moved", "embedding moved", "fact insert"],
)
def test_a_dependent_of_no_message_is_refused_as_a_foreign_key_would(
    statement: str, admin: psycopg.Connection, world: World, both: tuple[Dependents, Dependents]
) -> None:
    a, _ = both
    params = {
        "user": world.a.user_id,
        "session": world.a_session,
        "answer": a.answer,
        "question": a.question,
    }
    with pytest.raises(psycopg.errors.ForeignKeyViolation):
        admin.execute(statement, params)
    assert counts(admin, a) == (1, 1, 1)


DELETE_MESSAGE = "delete from public.chat_message_history where id = %s and user_id = %s"


def test_a_rating_in_flight_holds_its_answer_until_it_commits(
    admin_url: str, admin: psycopg.Connection, world: World
) -> None:
    answer = message_ids(admin, world.a_session).answer
    with psycopg.connect(admin_url) as rating, psycopg.connect(admin_url) as deleting:
        rating.execute(
            "insert into memchat.message_feedback"
            " (message_id, user_id, session_id, agent_name, rating)"
            " values (%s, %s, %s, 'default', -1)",
            (answer, world.a.user_id, world.a_session),
        )
        # Where the delete waits (on Citus: the answer's worker) the timeout holds.
        set_local_on_citus(deleting, "citus.propagate_set_commands", "local")
        deleting.execute("set local lock_timeout = '300ms'")
        with pytest.raises(psycopg.errors.LockNotAvailable):
            deleting.execute(DELETE_MESSAGE, (answer, world.a.user_id))
        deleting.rollback()
        rating.commit()
        deleting.execute(DELETE_MESSAGE, (answer, world.a.user_id))
        deleting.commit()
    left = admin.execute(
        "select count(*) from memchat.message_feedback where message_id = %s", (answer,)
    ).fetchone()
    assert left == (0,)


def test_a_rating_of_an_answer_being_deleted_waits_and_is_refused(
    admin_url: str, admin: psycopg.Connection, world: World
) -> None:
    answer = message_ids(admin, world.a_session).answer
    outcome: dict[str, Any] = {}

    def rate() -> None:
        with psycopg.connect(admin_url) as rating:
            try:
                rating.execute(
                    "insert into memchat.message_feedback"
                    " (message_id, user_id, session_id, agent_name, rating)"
                    " values (%s, %s, %s, 'default', 1)",
                    (answer, world.a.user_id, world.a_session),
                )
                rating.commit()
                outcome["result"] = "stored"
            except psycopg.Error as exc:
                outcome["result"] = type(exc).__name__

    with psycopg.connect(admin_url) as deleting:
        deleting.execute(DELETE_MESSAGE, (answer, world.a.user_id))
        rater = threading.Thread(target=rate)
        rater.start()
        time.sleep(0.5)
        waited = rater.is_alive()  # the rating waits on the delete's row lock
        deleting.commit()
        rater.join(timeout=10)
    assert waited
    assert outcome["result"] == "ForeignKeyViolation"
    left = admin.execute(
        "select count(*) from memchat.message_feedback where message_id = %s", (answer,)
    ).fetchone()
    assert left == (0,)


def test_no_foreign_key_acts_per_deleted_message(admin: psycopg.Connection) -> None:
    """A foreign key on the messages would run a query per deleted message
    again (docs/benchmarks.md, "Scheduled cleanup"): the triggers do its work."""
    keys = admin.execute(
        "select conrelid::regclass::text from pg_constraint"
        " where contype = 'f' and confrelid = 'public.chat_message_history'::regclass"
    ).fetchall()
    assert keys == []
