"""A pgbouncer in transaction mode in front of the test database."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator

import pytest

from memchat import devdb
from memchat.store.db import Database
from tests.utils import pgbouncer

POOL_SIZE = 2


@pytest.fixture(scope="module")
def pooler(admin_url: str, role_password: str | None) -> Iterator[pgbouncer.Pooler]:
    """pgbouncer with POOL_SIZE server connections per login role."""
    users = {devdb.API_ROLE: role_password, devdb.CLEANUP_ROLE: role_password}
    running = pgbouncer.start(admin_url, users, pool_size=POOL_SIZE)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def single_pooler(admin_url: str, role_password: str | None) -> Iterator[pgbouncer.Pooler]:
    """pgbouncer with one server connection: every request shares it."""
    running = pgbouncer.start(admin_url, {devdb.API_ROLE: role_password}, pool_size=1)
    yield running
    running.stop()


@pytest.fixture
def through(database_url: str, cleanup_url: str) -> Callable[[pgbouncer.Pooler, str], str]:
    """The API's (or the cleanup's) connection string, routed through a pooler."""
    urls = {"api": database_url, "cleanup": cleanup_url}

    def route(pooler: pgbouncer.Pooler, role: str = "api") -> str:
        return pooler.url(urls[role])

    return route


@pytest.fixture
async def single_db(single_pooler: pgbouncer.Pooler, database_url: str) -> AsyncIterator[Database]:
    """Twenty client connections, one server connection behind them."""
    db = Database(single_pooler.url(database_url), max_connections=20)
    yield db
    await db.close()
