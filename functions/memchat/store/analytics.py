"""The operator's analytics views (schema `memchat_analytics`), read as `memchat_analyst`.

One read-only transaction that first switches to the analyst role (`set
local role`), so what is read is exactly what that role may see; a login
that may not become it reads with its own rights. Synchronous: `memchat
stats` runs it once.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, LiteralString

import psycopg
from psycopg import errors, sql

ANALYST_ROLE = "memchat_analyst"
SCHEMA = "memchat_analytics"


class AnalyticsError(Exception):
    """The views cannot be read (missing, not allowed, no database): a
    sentence for the operator, with no secret in it."""


@dataclass(frozen=True)
class Column:
    name: str  # the view's column, and the JSON key
    header: str  # in the printed table
    kind: str  # day | text | int | float | rate


@dataclass(frozen=True)
class Section:
    """One view, as a report reads it."""

    view: str  # in memchat_analytics; also the report's (and the JSON's) key
    title: str
    columns: tuple[Column, ...]
    order: tuple[str, ...]
    by_day: bool  # has `day`: filtered to the last N days
    by_agent: bool  # has `agent_name`: filtered to --agent
    empty: str  # printed instead of an empty table ({window}, {agent})


@dataclass(frozen=True)
class ViewsRead:
    login: str  # the role the connection logged in as
    read_as: str  # the role the views were read as
    since: dt.date  # the first day read (UTC)
    until: dt.date  # today (UTC)
    rows: dict[str, list[dict[str, Any]]]  # per view, in the order asked


def read_views(
    conn: psycopg.Connection[Any], sections: Sequence[Section], *, days: int, agent: str | None
) -> ViewsRead:
    """Every section's view for the last `days` days (UTC) and `agent` (None:
    all), in one read-only transaction as memchat_analyst where the login may
    become it. `conn` must be in autocommit mode (store.db.connect)."""
    login = "?"
    try:
        with conn.transaction():
            conn.execute("set transaction read only")
            (login,) = _row(conn, "select current_user")
            _become_analyst(conn)
            read_as, since, until = _row(
                conn,
                "select current_user, (now() at time zone 'UTC')::date - %s::integer,"
                " (now() at time zone 'UTC')::date",
                (days - 1,),
            )
            params = {"since": since, "agent": agent}
            rows: dict[str, list[dict[str, Any]]] = {}
            for section in sections:
                cur = conn.execute(_query(section), params)
                names = [d.name for d in cur.description or ()]
                rows[section.view] = [dict(zip(names, row, strict=True)) for row in cur]
    except (errors.UndefinedTable, errors.InvalidSchemaName) as exc:
        raise AnalyticsError(
            f"this database has no {SCHEMA} views: apply the migrations (memchat migrate)"
        ) from exc
    except errors.InsufficientPrivilege as exc:
        raise AnalyticsError(
            f"{login} may not read {SCHEMA} ({first_line(exc)}): connect as the project"
            f" owner, or grant {ANALYST_ROLE} to {login} (docs/analytics.md)"
        ) from exc
    except psycopg.OperationalError as exc:
        raise AnalyticsError(f"the database connection failed: {first_line(exc)}") from exc
    return ViewsRead(login, read_as, since, until, rows)


def _become_analyst(conn: psycopg.Connection[Any]) -> None:
    """`set local role memchat_analyst`, in a savepoint: if the login may
    not (or the role is missing), the transaction goes on as the login."""
    try:
        with conn.transaction():
            conn.execute(sql.SQL("set local role {}").format(sql.Identifier(ANALYST_ROLE)))
    except (errors.InsufficientPrivilege, errors.InvalidParameterValue):
        pass


def _query(section: Section) -> sql.Composed:
    """select <columns> from memchat_analytics.<view> [where ...] order by ..."""
    # Counts and sums as integers, averages and rates as floats (not numeric).
    casts = {"int": sql.SQL("::bigint"), "float": sql.SQL("::float8"), "rate": sql.SQL("::float8")}
    columns = sql.SQL(", ").join(
        sql.SQL("{}{} as {}").format(
            sql.Identifier("v", c.name), casts.get(c.kind, sql.SQL("")), sql.Identifier(c.name)
        )
        for c in section.columns
    )
    conditions = []
    if section.by_day:
        conditions.append(sql.SQL("v.day >= %(since)s"))
    if section.by_agent:
        conditions.append(sql.SQL("(%(agent)s::text is null or v.agent_name = %(agent)s::text)"))
    where = sql.SQL(" where ") + sql.SQL(" and ").join(conditions) if conditions else sql.SQL("")
    order = sql.SQL(", ").join(sql.Identifier("v", name) for name in section.order)
    return sql.SQL("select {columns} from {view} v{where} order by {order}").format(
        columns=columns, view=sql.Identifier(SCHEMA, section.view), where=where, order=order
    )


def _row(
    conn: psycopg.Connection[Any], query: LiteralString, params: tuple[Any, ...] = ()
) -> tuple[Any, ...]:
    row = conn.execute(query, params).fetchone()
    assert row is not None
    return tuple(row)


def first_line(exc: BaseException) -> str:
    """An exception's first line (a database error's sentence, without its detail)."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
