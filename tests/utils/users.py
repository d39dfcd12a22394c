"""Users in auth.users and their verified-claims callers."""

from __future__ import annotations

import time
import uuid
from typing import Any

import psycopg

from memchat.store import Caller


def claims_for(user_id: uuid.UUID, email: str | None = None) -> dict[str, Any]:
    now = int(time.time())
    return {
        "sub": str(user_id),
        "role": "authenticated",
        "aud": "authenticated",
        "email": email or f"{user_id}@example.test",
        "iat": now,
        "exp": now + 3600,
    }


# The owner's connection string, for helpers that create users without a
# connection at hand (set once per test session by tests/conftest.py).
_ADMIN_CONNINFO: str | None = None


def set_admin_conninfo(conninfo: str) -> None:
    global _ADMIN_CONNINFO
    _ADMIN_CONNINFO = conninfo


def create_user(user_id: uuid.UUID, email: str | None = None) -> None:
    """A user in auth.users, created with the owner's rights."""
    assert _ADMIN_CONNINFO, "the `users` fixture sets the owner's connection"
    with psycopg.connect(_ADMIN_CONNINFO, autocommit=True) as conn:
        conn.execute(
            "insert into auth.users (id, aud, role, email) values"
            " (%s, 'authenticated', 'authenticated', %s)",
            (user_id, email or f"{user_id}@example.test"),
        )


class UserFactory:
    def __init__(self, admin: psycopg.Connection) -> None:
        self.admin = admin

    def create(self, email: str | None = None, user_id: uuid.UUID | None = None) -> Caller:
        user_id = user_id or uuid.uuid4()
        email = email or f"{user_id}@example.test"
        self.admin.execute(
            "insert into auth.users (id, aud, role, email) values (%s, 'authenticated',"
            " 'authenticated', %s)",
            (user_id, email),
        )
        return Caller(user_id=user_id, claims=claims_for(user_id, email))
