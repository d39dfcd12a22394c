"""Each limit is defined once: the settings, and the database's copy checked against them.

The API's settings (functions/memchat/config.py) are where a limit is
defined; `memchat.limits` (supabase/schemas/grants.sql) holds the
database's copy, which every writer is held to (triggers). Their defaults
must be the same numbers: a change to one without the other fails here.
"""

from __future__ import annotations

import json
import uuid
from datetime import timedelta

import psycopg
from psycopg.types.json import Jsonb

from memchat import messages
from memchat.config import Settings
from tests.store.conftest import World
from tests.store.test_privileges import sqlstate
from tests.utils.store_data import acting_as

# memchat.limits' column -> (the setting it copies, how its default converts).
COPIES = {
    "max_message_chars": ("max_message_chars", int),
    "max_notes_chars": ("ltm_max_chars", int),
    "max_session_ttl": ("session_ttl_hours", lambda hours: timedelta(hours=hours)),
    "max_import_message_chars": ("import_max_message_chars", int),
    "max_stored_messages": ("user_max_stored_messages", int),
}


def test_the_databases_limits_default_to_the_settings(admin: psycopg.Connection) -> None:
    with admin.transaction(force_rollback=True):
        admin.execute(
            "create temporary table fresh_limits (like memchat.limits including defaults)"
        )
        admin.execute("insert into fresh_limits default values")
        cur = admin.execute("select * from fresh_limits")
        names = [d.name for d in cur.description or ()]
        defaults = dict(zip(names, cur.fetchone() or (), strict=True))
    for column, (setting, convert) in COPIES.items():
        assert defaults[column] == convert(Settings.model_fields[setting].default), column


def test_a_new_turns_message_is_held_to_max_message_chars_an_imported_one_is_not(
    conn: psycopg.Connection, world: World
) -> None:
    """The messages' trigger lets a user message be as long as an import's
    (max_import_message_chars); record_turn holds a new turn's to
    max_message_chars, whoever calls it."""
    turn = (
        "select memchat.record_turn(%(u)s, %(s)s, 'default', 't', %(m)s, interval '1 hour',"
        " null, null,"
        " 0, false, null, null, null)"
    )
    for length, refused in ((16_000, False), (16_001, True)):
        with acting_as(conn, world.a.claims):
            said = Jsonb([messages.human("x" * length), messages.ai("ok")])
            params = {"u": world.a.user_id, "s": uuid.uuid4(), "m": said}
            assert (sqlstate(conn, turn, params) == "MC413") is refused
    with acting_as(conn, world.a.claims):
        session = {
            "id": str(uuid.uuid4()),
            "agent_name": "default",
            "title": "t",
            "status": "active",
            "created_at": "2024-01-01T00:00:00Z",
            "last_active_at": "2024-01-01T00:00:00Z",
            "messages": [
                {"message": messages.human("y" * 150_000), "created_at": "2024-01-01T00:00:00Z"}
            ],
        }
        imported = conn.execute(
            "select memchat.import_sessions(%s, %s, '[]', '[]', '1 hour', null)",
            (world.a.user_id, json.dumps([session])),
        ).fetchone()
    assert imported is not None and len(imported[0]["sessions"]) == 1
