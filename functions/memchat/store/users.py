"""Local users for development: `memchat token` creates them in auth.users.

Never on Supabase, where Supabase Auth owns auth.users.
"""

from __future__ import annotations

import uuid
from typing import Any

import psycopg

from memchat.store.migrations import is_supabase


class LocalUserError(Exception):
    """The user cannot be made here; the sentence says what to pass instead."""


def ensure_local_user(
    conn: psycopg.Connection[Any], user_id: uuid.UUID | None, email: str
) -> uuid.UUID:
    """The local user with this id or email, created if missing. On Supabase,
    the given id as it is (its Auth owns the users)."""
    if is_supabase(conn):
        if user_id is None:
            raise LocalUserError("on Supabase, pass --user-id of a user of your project")
        return user_id
    if user_id is None:
        row = conn.execute("select id from auth.users where email = %s", (email,)).fetchone()
        if row:
            return uuid.UUID(str(row[0]))
        user_id = uuid.uuid4()
    elif conn.execute("select 1 from auth.users where id = %s", (user_id,)).fetchone():
        return user_id
    created = conn.execute(
        "insert into auth.users (id, aud, role, email) values"
        " (%s, 'authenticated', 'authenticated', %s) on conflict do nothing returning id",
        (user_id, email),
    ).fetchone()
    if created is None:
        raise LocalUserError(f"{email} is another local user's email: pass another --email")
    return user_id
