"""Shared fixtures: a real PostgreSQL with the migrations applied.

The embedded server (pgserver) is started in a temporary directory, unless
DATABASE_URL points at one already (it must be a disposable database).
"""

from __future__ import annotations

import os
import secrets
import signal
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from memchat import devdb
from memchat.config import Settings, load_settings
from memchat.devdb import quiet_runtime_dir
from memchat.model.client import ModelClient
from memchat.store.db import Database
from memchat.store.migrations import migrate
from memchat.throttle import Bucket
from tests.utils import embedded_postgres
from tests.utils.analytics_data import Fresh, fresh_database
from tests.utils.api import ApiClient
from tests.utils.dev_server import DevServer, dev_server
from tests.utils.fake_openai import FakeOpenAI
from tests.utils.users import UserFactory, set_admin_conninfo


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--citus",
        action="store_true",
        help="run the Citus lane: the modules of CITUS_LANE against a Citus cluster of"
        " their own (infra/citus.sh), migrated and distributed (`memchat db distribute`)",
    )


# The behaviour tests that run on Citus too (`pytest --citus`, infra/test.sh):
# these directories' modules, but those of CITUS_NOT_YET and the tests marked
# plain_only (what one PostgreSQL server itself does: its plans, its
# counters, its catalog as the migrations leave it) or data_api (what the
# Data API does, which Citus does not serve: docs/deploy.md, "Citus").
CITUS_LANE = ("tests/store", "tests/api", "tests/cleanup")
# What does not run on Citus yet (docs/deploy.md, "Citus", says why): modules,
# or tests (module::name).
CITUS_NOT_YET = (
    # LangChain's inserts name no user_id (the distribution column).
    "tests/store/test_langchain_compat.py::test_memchat_reads_messages_langchain_added",
    "tests/store/test_langchain_compat.py::"
    "test_langchain_under_rls_writes_only_into_the_users_own_sessions",
)


@pytest.fixture(scope="session")
def admin_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """The owner's (superuser's) connection: migrations, arranging and checking rows."""
    if request.config.getoption("--citus"):
        yield from _citus_admin_url()
        return
    url = os.environ.get("DATABASE_URL")
    if url:
        migrate(url)
        set_admin_conninfo(url)
        yield url
        return
    quiet_runtime_dir()
    # Outside pytest's temporary directories: see tests/utils/embedded_postgres.py.
    with embedded_postgres.private_server() as uri:
        migrate(uri)
        set_admin_conninfo(uri)
        yield uri


def _citus_admin_url() -> Iterator[str]:
    """A Citus cluster's coordinator, migrated and distributed, for this run."""
    import shutil
    import tempfile

    from memchat.store.distribute import distribute
    from tests.utils.citus_cluster import citus_cluster

    # Outside pytest's temporary directories: see tests/utils/citus_cluster.py.
    home = Path(tempfile.mkdtemp(prefix="memchat-test-citus-lane-"))
    try:
        with citus_cluster(home) as cluster:
            migrate(cluster.coordinator_url)
            distribute(cluster.coordinator_url)
            set_admin_conninfo(cluster.coordinator_url)
            yield cluster.coordinator_url
    finally:
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="session")
def role_password(admin_url: str) -> str | None:
    """The login roles' password for this run: None on the embedded server
    (it trusts local logins); on a DATABASE_URL server (a disposable one) the
    roles get a fresh one."""
    if not conninfo_to_dict(admin_url).get("password"):
        return None
    password = secrets.token_urlsafe(24)
    with psycopg.connect(admin_url, autocommit=True) as conn:
        for role in devdb.LOGIN_ROLES:
            conn.execute(
                sql.SQL("alter role {} with password {}").format(
                    sql.Identifier(role), sql.Literal(password)
                )
            )
    return password


@pytest.fixture(scope="session")
def role_urls(admin_url: str, role_password: str | None) -> dict[str, str]:
    """How each login role of the migrations connects (the API's, the cleanup's)."""
    return {role: devdb.role_conninfo(admin_url, role, role_password) for role in devdb.LOGIN_ROLES}


@pytest.fixture(scope="session")
def database_url(role_urls: dict[str, str]) -> str:
    """What the API logs in with: `memchat_api`, a role with no rights of its own."""
    return role_urls[devdb.API_ROLE]


@pytest.fixture(scope="session")
def cleanup_url(role_urls: dict[str, str]) -> str:
    """What the scheduled cleanup logs in with: `memchat_cleanup`."""
    return role_urls[devdb.CLEANUP_ROLE]


@pytest.fixture(scope="session")
def worker_url(role_urls: dict[str, str]) -> str:
    """What the summary worker logs in with: `memchat_worker`."""
    return role_urls[devdb.WORKER_ROLE]


@pytest.fixture(scope="session")
def admin(admin_url: str) -> Iterator[psycopg.Connection]:
    """A superuser connection (bypasses RLS) for arranging and checking rows."""
    with psycopg.connect(admin_url, autocommit=True) as conn:
        yield conn


@pytest.fixture(scope="session")
def users(admin: psycopg.Connection) -> UserFactory:
    return UserFactory(admin)


@pytest.fixture
async def db(database_url: str) -> AsyncIterator[Database]:
    database = Database(database_url, max_connections=30)
    yield database
    await database.close()


def pytest_configure(config: pytest.Config) -> None:
    # A shell without job control starts a background command (`bash
    # infra/test.sh &` in a script) with SIGINT ignored, and an ignored signal
    # stays ignored in every child: the CLI processes the tests interrupt
    # (Ctrl-C in `memchat chat`, `memchat embeddings serve`) would never see
    # it. A handled signal is reset to its default in a child.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


# ------------------------------------------------------------------ API

JWT_SECRET = "test-jwt-secret-with-at-least-32-characters"
UNUSED_DATABASE = "postgresql://unused@127.0.0.1:1/unused"  # never connected to


@pytest.fixture(scope="session")
def fake_openai() -> Iterator[FakeOpenAI]:
    server = FakeOpenAI()
    yield server
    server.close()


@pytest.fixture
def model(fake_openai: FakeOpenAI) -> FakeOpenAI:
    """The fake model, with an empty script and request log for this test."""
    fake_openai.reset()
    return fake_openai


def make_settings(database_url: str, model_url: str, **overrides: object) -> Settings:
    values: dict[str, object] = {
        "database_url": database_url,
        "supabase_jwt_secret": JWT_SECRET,
        "openai_api_key": "test-key",
        "openai_base_url": model_url,
        "openai_model": "fake-model",
        "openai_max_retries": 0,
        "openai_timeout_seconds": 5,
        "db_max_connections": 30,
        # Tests run many requests a second; the throttles have their own tests.
        **{f"{bucket.value}_rate_per_minute": 0 for bucket in Bucket},
    }
    values.update(overrides)
    return load_settings(**values)


@pytest.fixture
async def custom_api(
    database_url: str, model: FakeOpenAI
) -> AsyncIterator[Callable[..., ApiClient]]:
    """Builds apps with overridden settings (`custom_api(turn_timeout_seconds=1)`);
    closes them after the test."""
    clients: list[ApiClient] = []

    def build(**overrides: object) -> ApiClient:
        client = ApiClient(make_settings(database_url, model.url, **overrides))
        clients.append(client)
        return client

    yield build
    for client in clients:
        await client.aclose()


@pytest.fixture
async def model_client_for(
    request: pytest.FixtureRequest,
) -> AsyncIterator[Callable[..., ModelClient]]:
    """`model_client_for(url, **overrides)`: a ModelClient for the model server at
    `url` (no database), with the test module's MODEL_CLIENT_SETTINGS (if any)
    and `overrides` as settings; each is closed after the test."""
    defaults = getattr(request.module, "MODEL_CLIENT_SETTINGS", {})
    clients: list[ModelClient] = []

    def build(url: str, **overrides: object) -> ModelClient:
        settings = make_settings(UNUSED_DATABASE, url, **{**defaults, **overrides})
        clients.append(ModelClient(settings))
        return clients[-1]

    yield build
    for client in clients:
        await client.close()


@pytest.fixture
def settings(database_url: str, fake_openai: FakeOpenAI) -> Settings:
    return make_settings(database_url, fake_openai.url)


@pytest.fixture
async def api(settings: Settings) -> AsyncIterator[ApiClient]:
    """An HTTP client for the app (in-process ASGI), with token helpers."""
    client = ApiClient(settings)
    yield client
    await client.aclose()


@pytest.fixture(scope="module")
def _paced_model(request: pytest.FixtureRequest) -> Iterator[FakeOpenAI]:
    model = FakeOpenAI(chunk_delay=getattr(request.module, "MODEL_CHUNK_DELAY", 0.0))
    yield model
    model.close()


@pytest.fixture(scope="module")
def _dev(
    admin_url: str, _paced_model: FakeOpenAI, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[DevServer]:
    with dev_server(admin_url, tmp_path_factory.mktemp("dev"), _paced_model) as running:
        yield running


@pytest.fixture
def dev_model(_paced_model: FakeOpenAI) -> FakeOpenAI:
    """The model of the module's `dev` (its script reset): the fake OpenAI
    server pacing its answers MODEL_CHUNK_DELAY seconds a piece (a constant
    of the test module; default 0)."""
    _paced_model.reset()
    return _paced_model


@pytest.fixture
def dev(_dev: DevServer, dev_model: FakeOpenAI) -> DevServer:
    """`memchat dev` as a developer runs it (a subprocess, one per test
    module) against the test database, its model `dev_model`."""
    return _dev


@pytest.fixture(scope="module")
def fresh(admin: psycopg.Connection, admin_url: str, role_password: str | None) -> Iterator[Fresh]:
    """A database of the module's own on the test server, migrated (for
    tests that need to see every row: the operator's analytics)."""
    with fresh_database(admin, admin_url, role_password) as database:
        yield database


# ------------------------------------------------------------ kinds of test

# Each test gets one of the markers registered in pyproject.toml, from where it
# lives: `pytest -m unit` is the fast lane (`make test-fast`), which needs no
# database. A test under tests/unit that asks for the test database (any
# fixture built on `admin_url`) is a `db` test wherever it lives.
_KIND_BY_DIRECTORY = {
    "unit": "unit",
    "browser": "browser",
    "bench": "bench_smoke",
    "citus": "citus",
}
_TESTS_ROOT = Path(__file__).resolve().parent


def _not_yet(entry: str) -> tuple[Path, str | None]:
    """A CITUS_NOT_YET entry as (module, test name or None for all of it)."""
    module, _, name = entry.partition("::")
    return (_TESTS_ROOT.parent / module).resolve(), name or None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--citus"):
        lane = [(_TESTS_ROOT.parent / directory).resolve() for directory in CITUS_LANE]
        not_yet = {_not_yet(entry) for entry in CITUS_NOT_YET}

        def in_lane(item: pytest.Item) -> bool:
            path = item.path.resolve()
            return (
                any(path.is_relative_to(directory) for directory in lane)
                and (path, None) not in not_yet
                and (path, item.originalname) not in not_yet  # type: ignore[attr-defined]
                and item.get_closest_marker("plain_only") is None
                and item.get_closest_marker("data_api") is None
            )

        chosen = [item for item in items if in_lane(item)]
        left = [item for item in items if not in_lane(item)]
        if left:
            config.hook.pytest_deselected(items=left)
        items[:] = chosen
    for item in items:
        path = item.path.resolve()
        top = path.relative_to(_TESTS_ROOT).parts[0] if path.is_relative_to(_TESTS_ROOT) else ""
        kind = _KIND_BY_DIRECTORY.get(top, "db")
        if kind == "unit" and "admin_url" in getattr(item, "fixturenames", ()):
            kind = "db"
        item.add_marker(kind)
