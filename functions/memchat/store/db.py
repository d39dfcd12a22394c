"""Connections, the per-request transaction, and the database's errors.

The API logs in as `memchat_api`, a role with no rights of its own. Every
user request runs in one transaction that first switches to `memchat_user`
(the role with the API's grants and the RLS policies) with the caller's
verified claims, as PostgREST does for `authenticated`; so row-level
security keeps users apart, and a statement sent without the switch is
refused rather than run with wider rights. Work is sent in pipeline mode with a
single Sync: BEGIN, the claims, the queries, COMMIT, all in one network round
trip, atomic (an error anywhere rolls back everything).

Built for Supabase's transaction-mode pooler: no server-side prepared
statements, no session state outside a transaction, and at most
`db_max_connections` connections per process (1 in Lambda).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.pq import TransactionStatus

from memchat.errors import (
    DatabasePermissionDenied,
    DatabaseUnavailable,
    InvalidInput,
    MemchatError,
    NotesConflict,
    PayloadTooLarge,
    QuotaExceeded,
    RateLimited,
    Unauthorized,
)
from memchat.store import fragments

if TYPE_CHECKING:
    from psycopg import AsyncConnection

    from memchat.config import Settings
    from memchat.throttle import Bucket, Rate

# The role every user request runs as (supabase/schemas/grants.sql).
REQUEST_ROLE = "memchat_user"

# A user request's transaction opens with the switch to REQUEST_ROLE and then
# the caller's claims and the request's timeouts and stored-messages quota (+
# UTC timestamps in JSON built by the database): SET LOCAL in an explicit
# block, which Citus repeats on each worker the transaction reaches
# (memchat.begin_request, supabase/schemas/functions/requests.sql).
SET_ROLE = "set local role " + REQUEST_ROLE
SET_CLAIMS = (
    "select memchat.begin_request("
    "%(claims)s, %(statement_timeout)s, %(idle_timeout)s, %(max_stored)s)"
)


@dataclass(frozen=True)
class RequestLimits:
    """What every user request's transaction is held to: its timeouts
    (DB_STATEMENT_TIMEOUT_MS, DB_IDLE_IN_TRANSACTION_TIMEOUT_MS), the
    messages a user may store (USER_MAX_STORED_MESSAGES: the database's
    memchat.max_stored_messages() takes the lower of it and its own) and the
    rates of the throttles (memchat.throttle)."""

    statement_timeout_ms: int = 15_000
    idle_in_transaction_timeout_ms: int = 60_000
    max_stored_messages: int = 100_000
    rates: Mapping[Bucket, Rate] = field(default_factory=dict)

    @classmethod
    def from_settings(cls, settings: Settings) -> RequestLimits:
        from memchat.throttle import rates

        return cls(
            statement_timeout_ms=settings.db_statement_timeout_ms,
            idle_in_transaction_timeout_ms=settings.db_idle_in_transaction_timeout_ms,
            max_stored_messages=settings.user_max_stored_messages,
            rates=rates(settings),
        )

    def rate(self, bucket: Bucket) -> Rate:
        from memchat.throttle import OFF

        return self.rates.get(bucket, OFF)


DEFAULT_LIMITS = RequestLimits()


def claims_statements(
    claims: Mapping[str, Any], limits: RequestLimits = DEFAULT_LIMITS
) -> list[tuple[str, Any]]:
    """The statements (query, params) that make an open transaction a user
    request's: as REQUEST_ROLE, with these claims and limits."""
    params = {
        "claims": json.dumps(claims),
        "statement_timeout": limits.statement_timeout_ms,
        "idle_timeout": limits.idle_in_transaction_timeout_ms,
        "max_stored": limits.max_stored_messages,
    }
    return [(SET_ROLE, None), (SET_CLAIMS, params)]


# Takes a token from the caller's bucket, or raises SQLSTATE MC429 (its
# DETAIL: the seconds to wait), which aborts the whole transaction.
THROTTLE = "select memchat.throttle(%s, %s, %s)"
RATE_LIMITED_SQLSTATE = "MC429"


USER_EXISTS = "select memchat.current_user_exists()"

# A connection idle longer than this is pinged before use: Lambda freezes
# and poolers close idle clients, and a dead socket must not fail a turn.
IDLE_CHECK_SECONDS = 30.0


def _require_user(row: tuple[Any, ...] | None) -> None:
    if not (row and row[0]):
        raise Unauthorized("This account no longer exists; sign in again.")


# Raised by the migrations' SQL functions and triggers.
NOTES_CONFLICT_SQLSTATE = "MC409"
TOO_LARGE_SQLSTATE = "MC413"
QUOTA_SQLSTATE = "MCQTA"  # DETAIL: the limit
NOT_ALLOWED_SQLSTATE = "MC422"


def translate(exc: psycopg.Error) -> Exception:
    """A database error as the API's error: what the migrations' functions
    and triggers raise (a notes conflict, a limit), a deleted user's row,
    the throttle, a missing permission; else the error itself."""
    if exc.sqlstate == NOTES_CONFLICT_SQLSTATE:
        return NotesConflict()
    if exc.sqlstate == QUOTA_SQLSTATE:
        detail = exc.diag.message_detail or ""
        return QuotaExceeded(int(detail) if detail.isdigit() else 0)
    if exc.sqlstate == TOO_LARGE_SQLSTATE:
        return PayloadTooLarge("A value is larger than the database allows; shorten it.")
    if exc.sqlstate == NOT_ALLOWED_SQLSTATE or isinstance(exc, psycopg.errors.CheckViolation):
        return InvalidInput()
    if isinstance(exc, psycopg.errors.ForeignKeyViolation):
        return Unauthorized("This account no longer exists.")
    return refusal(exc) or exc


def refusal(exc: psycopg.Error) -> MemchatError | None:
    """A statement the database refused for who the caller is, as the API's
    error: the throttle (429), or a permission the API's role lacks (a
    logged 500: a bad migration, never the caller's doing). None otherwise."""
    if isinstance(exc, psycopg.errors.InsufficientPrivilege):
        return DatabasePermissionDenied.of(exc)
    if exc.sqlstate != RATE_LIMITED_SQLSTATE:
        return None
    from memchat.throttle import describe

    try:
        seconds = float(exc.diag.message_detail or 1)
    except ValueError:
        seconds = 1.0
    return RateLimited(seconds, describe(exc.diag.message_primary or ""))


def constraint_of(exc: psycopg.Error) -> str | None:
    """The constraint `exc` names, as the schema names it. Citus relays an
    error raised on a worker without its fields, the constraint named in its
    message only, and there by the shard's copy, the shard's id appended
    (`chat_message_history_client_message_idx_102081`)."""
    name = exc.diag.constraint_name
    if name is None:
        found = _NAMED_CONSTRAINT.search(exc.diag.message_primary or "")
        name = found.group(1) if found else None
    return _SHARD_SUFFIX.sub("", name) if name else None


_NAMED_CONSTRAINT = re.compile(r'constraint "([^"]+)"')
_SHARD_SUFFIX = re.compile(r"_\d{6,}$")


def connect_kwargs() -> dict[str, Any]:
    """Options every connection needs to work behind a transaction pooler."""
    return {"autocommit": True, "prepare_threshold": None, "connect_timeout": 10}


class Database:
    """A small set of reusable async connections (one in Lambda)."""

    def __init__(
        self, conninfo: str, max_connections: int = 1, limits: RequestLimits = DEFAULT_LIMITS
    ) -> None:
        self._conninfo = conninfo
        self._max = max_connections
        self.limits = limits
        self._idle: list[tuple[AsyncConnection[Any], float]] = []
        self._slots: asyncio.Semaphore | None = None
        self._slots_loop: asyncio.AbstractEventLoop | None = None

    def _semaphore(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if self._slots is None or self._slots_loop is not loop:
            # Lambda and tests may run successive requests in new event loops.
            self._slots = asyncio.Semaphore(self._max)
            self._slots_loop = loop
        return self._slots

    async def _connect(self) -> AsyncConnection[Any]:
        try:
            conn = await psycopg.AsyncConnection.connect(self._conninfo, **connect_kwargs())
        except psycopg.OperationalError as exc:
            raise DatabaseUnavailable() from exc
        fragments.register(conn.adapters)
        return conn

    async def _checkout(self) -> AsyncConnection[Any]:
        while self._idle:
            conn, idle_since = self._idle.pop()
            if conn.closed or conn.broken:
                continue
            if time.monotonic() - idle_since > IDLE_CHECK_SECONDS:
                try:
                    await conn.execute("select 1")
                except psycopg.Error:
                    await conn.close()
                    continue
            return conn
        return await self._connect()

    def _checkin(self, conn: AsyncConnection[Any]) -> None:
        status = conn.info.transaction_status
        if conn.closed or conn.broken or status != TransactionStatus.IDLE:
            return
        self._idle.append((conn, time.monotonic()))

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[AsyncConnection[Any]]:
        """A connection for the duration of the block, returned afterwards."""
        async with self._semaphore():
            conn = await self._checkout()
            try:
                yield conn
            except psycopg.OperationalError as exc:
                await conn.close()
                raise DatabaseUnavailable() from exc
            except BaseException:
                if conn.info.transaction_status not in (
                    TransactionStatus.IDLE,
                    TransactionStatus.UNKNOWN,
                ):
                    try:
                        await conn.rollback()
                    except psycopg.Error:
                        await conn.close()
                raise
            finally:
                self._checkin(conn)

    @asynccontextmanager
    async def pipeline(
        self, claims: Mapping[str, Any] | None, *, throttle: Bucket | None = None
    ) -> AsyncIterator[AsyncConnection[Any]]:
        """One atomic unit of work in one round trip.

        Statements executed in the block are queued; results are read after
        the block, when the single Sync has returned them all. With claims,
        the work runs as `memchat_user` for that user (and raises
        Unauthorized if the user no longer exists; every table references
        auth.users, so such a request cannot have written anything); with
        None, as the connecting role (cleanup, migrations, tests). With
        `throttle`, the work first takes a token from the caller's bucket,
        or raises RateLimited and does nothing.

        Example:
            async with db.pipeline(user.claims) as conn:
                cur = conn.cursor()
                await cur.execute("select count(*) from chat_sessions")
            (count,) = await cur.fetchone()
        """
        async with self.connection() as conn:
            try:
                async with conn.pipeline():
                    # An explicit block, committed after the caller's
                    # statements: SET LOCAL reaches Citus's workers only in
                    # one, and the workers' statements are atomic with the
                    # coordinator's. The block raising leaves it open, and
                    # `connection` rolls it back.
                    await conn.execute("begin")
                    check = None
                    if claims is not None:
                        for query, params in claims_statements(claims, self.limits):
                            await conn.execute(query, params)
                        check = conn.cursor()
                        await check.execute(USER_EXISTS)
                        await self._throttle(conn, throttle)
                    yield conn
                    await conn.execute("commit")
            except psycopg.Error as exc:
                raise refusal(exc) or exc from exc
            if check is not None:
                _require_user(await check.fetchone())

    async def value(
        self,
        claims: Mapping[str, Any] | None,
        query: Any,
        params: Any = None,
        *,
        throttle: Bucket | None = None,
    ) -> Any:
        """One statement in a `pipeline` of its own: the first column of its
        first row (None: no row)."""
        async with self.pipeline(claims, throttle=throttle) as conn:
            cur = conn.cursor()
            await cur.execute(query, params)
        row = await cur.fetchone()
        return row[0] if row else None

    async def _throttle(self, conn: AsyncConnection[Any], bucket: Bucket | None) -> None:
        rate = self.limits.rate(bucket) if bucket is not None else None
        if bucket is not None and rate is not None and rate.on:
            await conn.execute(THROTTLE, (bucket.value, rate.per_minute, rate.burst))

    @asynccontextmanager
    async def transaction(
        self,
        claims: Mapping[str, Any] | None,
        *,
        snapshot: bool = False,
        throttle: Bucket | None = None,
    ) -> AsyncIterator[AsyncConnection[Any]]:
        """An explicit transaction for work that reads between statements.

        `snapshot=True`: read-only and REPEATABLE READ, so a long read (an
        export) sees one consistent state however long it streams. Its
        `throttle` token is taken first, in a transaction of its own (a
        read-only one cannot take it).
        """
        if throttle is not None and claims is not None:
            async with self.pipeline(claims, throttle=throttle):
                pass
        async with self.connection() as conn:
            try:
                async with conn.transaction():
                    if snapshot:
                        await conn.execute(
                            "set transaction isolation level repeatable read, read only"
                        )
                    if claims is not None:
                        for query, params in claims_statements(claims, self.limits):
                            await conn.execute(query, params)
                        cur = await conn.execute(USER_EXISTS)
                        _require_user(await cur.fetchone())
                    yield conn
            except psycopg.Error as exc:
                raise refusal(exc) or exc from exc

    async def close(self) -> None:
        idle, self._idle = self._idle, []
        for conn, _ in idle:
            await conn.close()

    def reset(self) -> None:
        """Forget every idle connection (after a Lambda SnapStart restore).

        A connection kept from before the snapshot would be the same socket
        in every instance restored from it, and its server end is long gone:
        each is closed here without waiting for anything, from synchronous
        code (the runtime's hooks), and the next request connects afresh.
        The slots are re-created on the next request's event loop.
        """
        idle, self._idle = self._idle, []
        self._slots = None
        self._slots_loop = None
        for conn, _ in idle:
            # What AsyncConnection.close() does, minus the coroutine: closes
            # the socket (libpq sends a Terminate; a dead peer is ignored).
            conn.pgconn.finish()


async def database_ok(db: Database) -> bool:
    """Whether the database answers (GET /health): as the connecting role, no table."""
    async with db.pipeline(None) as conn:
        cur = conn.cursor()
        await cur.execute("select 1")
    return (await cur.fetchone()) == (1,)


def connect(conninfo: str) -> psycopg.Connection[Any]:
    """A synchronous connection for the batch jobs (cleanup, migrations, the
    dev tools, the analytics report): autocommit, pooler-safe."""
    conn = psycopg.connect(conninfo, **connect_kwargs())
    fragments.register(conn.adapters)
    return conn
