"""Each limit is defined once: the settings, and the database's copy checked against them.

The API's settings (functions/memchat/config.py) are where a limit is
defined; `memchat.limits` (migration *_least_privilege.sql) holds the
database's copy, which every writer is held to (triggers). Their defaults
must be the same numbers: a change to one without the other fails here.
"""

from __future__ import annotations

from datetime import timedelta

import psycopg

from memchat.config import Settings

# memchat.limits' column -> (the setting it copies, how its default converts).
COPIES = {
    "max_message_chars": ("max_message_chars", int),
    "max_notes_chars": ("ltm_max_chars", int),
    "max_session_ttl": ("session_ttl_hours", lambda hours: timedelta(hours=hours)),
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
