"""Arranging sessions for the cleanup tests directly as the table owner.

The cleanup deletes every expired session in the database, so each test
creates its own users and rows and asserts on its own ids.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest

from memchat.config import Settings
from memchat.usecases.cleanup import Cleanup

HOUR = timedelta(hours=1)
# Where the adaptive pause starts unless a test says otherwise: CLEANUP_PAUSE_FACTOR's default.
DEFAULT_PAUSE_FACTOR = Settings.model_fields["cleanup_pause_factor"].default


def cleanup_on(url: str, *, batch_size: int, **options: Any) -> Cleanup:
    """A cleanup on `url` (the memchat_cleanup role's), as configured by
    default but for `batch_size` and `options`."""
    options.setdefault("pause_factor", DEFAULT_PAUSE_FACTOR)
    return Cleanup(url, batch_size=batch_size, **options)


class Seeder:
    def __init__(self, admin: psycopg.Connection) -> None:
        self.admin = admin

    def session(
        self,
        user_id: uuid.UUID,
        *,
        expires_in: timedelta | None = None,
        expires_at: datetime | None = None,
        messages: int = 0,
        agent_name: str = "default",
        active: bool = False,
    ) -> uuid.UUID:
        """A session expiring `expires_in` from now (negative: expired) or at `expires_at`."""
        sid = uuid.uuid4()
        self.admin.execute(
            "insert into public.chat_sessions (id, user_id, agent_name, message_count,"
            " last_active_at, expires_at)"
            " values (%(id)s, %(user)s, %(agent)s, %(n)s, now() - interval '2 hours',"
            "  coalesce(%(at)s::timestamptz, now() + %(in)s::interval))",
            {
                "id": sid,
                "user": user_id,
                "agent": agent_name,
                "n": messages,
                "at": expires_at,
                "in": expires_in if expires_in is not None else -HOUR,
            },
        )
        self.messages(sid, user_id, messages)
        if active:
            self.admin.execute(
                "insert into public.user_agent_active_sessions (user_id, agent_name,"
                " active_session_id) values (%s, %s, %s)",
                (user_id, agent_name, sid),
            )
        return sid

    def messages(self, session_id: uuid.UUID, user_id: uuid.UUID, count: int) -> None:
        self.admin.execute(
            "insert into public.chat_message_history (session_id, user_id, message)"
            " select %s, %s, jsonb_build_object('type', 'human',"
            "   'data', jsonb_build_object('content', 'message ' || g))"
            " from generate_series(1, %s) g",
            (session_id, user_id, count),
        )

    def expired_bulk(self, user_id: uuid.UUID, sessions: int, messages_each: int) -> int:
        """Many expired sessions of one user; returns how many messages they hold."""
        with self.admin.transaction():
            self.admin.execute(
                "create temp table seeded on commit drop as"
                " select gen_random_uuid() as id from generate_series(1, %s)",
                (sessions,),
            )
            self.admin.execute(
                "insert into public.chat_sessions (id, user_id, message_count, expires_at)"
                " select id, %s, %s, now() - interval '1 hour' from seeded",
                (user_id, messages_each),
            )
            self.admin.execute(
                "insert into public.chat_message_history (session_id, user_id, message)"
                ' select s.id, %s, \'{"type": "human", "data": {"content": "x"}}\''
                " from seeded s cross join generate_series(1, %s)",
                (user_id, messages_each),
            )
        return sessions * messages_each

    def notes(self, user_id: uuid.UUID, agent_name: str, text: str) -> None:
        self.admin.execute(
            "insert into public.agent_long_term_memory (user_id, agent_name, notes)"
            " values (%s, %s, %s)",
            (user_id, agent_name, text),
        )

    # ------------------------------------------------------------ checks

    def exists(self, session_id: uuid.UUID) -> bool:
        row = self.admin.execute(
            "select exists (select 1 from public.chat_sessions where id = %s)", (session_id,)
        ).fetchone()
        return bool(row and row[0])

    def message_count(self, session_id: uuid.UUID) -> int:
        row = self.admin.execute(
            "select count(*) from public.chat_message_history where session_id = %s",
            (session_id,),
        ).fetchone()
        return int(row[0]) if row else 0

    def user_sessions(self, user_id: uuid.UUID) -> int:
        row = self.admin.execute(
            "select count(*) from public.chat_sessions where user_id = %s", (user_id,)
        ).fetchone()
        return int(row[0]) if row else 0

    def user_messages(self, user_id: uuid.UUID) -> int:
        row = self.admin.execute(
            "select count(*) from public.chat_message_history where user_id = %s", (user_id,)
        ).fetchone()
        return int(row[0]) if row else 0

    def pointer(self, user_id: uuid.UUID, agent_name: str) -> uuid.UUID | None:
        row = self.admin.execute(
            "select active_session_id from public.user_agent_active_sessions"
            " where user_id = %s and agent_name = %s",
            (user_id, agent_name),
        ).fetchone()
        return row[0] if row else None

    def totals(self) -> tuple[int, int]:
        """(sessions, messages) in the whole database."""
        row = self.admin.execute(
            "select (select count(*) from public.chat_sessions),"
            " (select count(*) from public.chat_message_history)"
        ).fetchone()
        assert row is not None
        return int(row[0]), int(row[1])


@pytest.fixture
def seed(admin: psycopg.Connection) -> Seeder:
    return Seeder(admin)
