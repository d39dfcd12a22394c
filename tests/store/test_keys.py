"""Every unique key of a user's table holds user_id: a table distributed by
user_id (Citus: docs/deploy.md) may have no other, and the one schema
serves both engines."""

from __future__ import annotations

import psycopg

# Unique indexes (primary keys and unique constraints among them) of the
# tables with a user_id column in memchat's schemas, partitions aside,
# that do not hold that column.
_WITHOUT_USER = """
select c.oid::regclass::text, i.indexrelid::regclass::text
  from pg_index i
  join pg_class c on c.oid = i.indrelid
  join pg_namespace n on n.oid = c.relnamespace
  join pg_attribute a on a.attrelid = c.oid and a.attname = 'user_id' and not a.attisdropped
 where i.indisunique and n.nspname in ('public', 'memchat') and not c.relispartition
   and not a.attnum = any(i.indkey)
 order by 1, 2
"""
_USER_TABLES = """
select count(*) from pg_class c
  join pg_namespace n on n.oid = c.relnamespace
  join pg_attribute a on a.attrelid = c.oid and a.attname = 'user_id' and not a.attisdropped
 where c.relkind in ('r', 'p') and n.nspname in ('public', 'memchat') and not c.relispartition
"""


def test_every_unique_key_of_a_users_table_holds_user_id(admin: psycopg.Connection) -> None:
    (tables,) = admin.execute(_USER_TABLES).fetchone() or (0,)
    assert tables >= 15  # the query sees memchat's tables
    assert admin.execute(_WITHOUT_USER).fetchall() == []
