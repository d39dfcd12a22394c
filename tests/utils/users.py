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


class UserFactory:
    def __init__(self, admin: psycopg.Connection) -> None:
        self.admin = admin

    def create(self, email: str | None = None) -> Caller:
        user_id = uuid.uuid4()
        email = email or f"{user_id}@example.test"
        self.admin.execute(
            "insert into auth.users (id, aud, role, email) values (%s, 'authenticated',"
            " 'authenticated', %s)",
            (user_id, email),
        )
        return Caller(user_id=user_id, claims=claims_for(user_id, email))
