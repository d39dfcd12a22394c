"""Shared fixtures: a real PostgreSQL with the migrations applied.

The embedded server (pgserver) is started in a temporary directory, unless
DATABASE_URL points at one already (it must be a disposable database).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import psycopg
import pytest

from memchat.db import Database
from memchat.migrate import migrate
from tests.utils.users import UserFactory


@pytest.fixture(scope="session")
def database_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    url = os.environ.get("DATABASE_URL")
    if url:
        migrate(url)
        yield url
        return
    os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")
    import pgserver

    data_dir: Path = tmp_path_factory.mktemp("pgdata")
    server = pgserver.get_server(data_dir, cleanup_mode="stop")
    uri = server.get_uri()
    migrate(uri)
    yield uri
    server.cleanup()


@pytest.fixture(scope="session")
def admin(database_url: str) -> Iterator[psycopg.Connection]:
    """A superuser connection (bypasses RLS) for arranging and checking rows."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        yield conn


@pytest.fixture(scope="session")
def users(admin: psycopg.Connection) -> UserFactory:
    return UserFactory(admin)


@pytest.fixture
async def db(database_url: str) -> AsyncIterator[Database]:
    database = Database(database_url, max_connections=30)
    yield database
    await database.close()
