"""A permission the API's own role lacks is a logged 500, never a 404.

Review finding 17: after a bad migration (a missing grant), the database's
refusal surfaced as 404 Not Found, which tells the client its session does
not exist and hides the operator's problem. Now it is a 500 in the
contract's shape, logged with what the database refused (object names only:
PostgreSQL's permission errors carry no values), and nothing is stored.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator

import psycopg
import pytest

from tests.conftest import make_settings
from tests.utils.analytics_data import Fresh
from tests.utils.api import ApiClient
from tests.utils.chat_api import assert_error
from tests.utils.fake_openai import FakeOpenAI
from tests.utils.users import UserFactory

SECRET = "a message nobody may log"


@pytest.fixture
def revoked(fresh: Fresh) -> Iterator[psycopg.Connection]:
    """The module's own database, with grants a test takes away put back after."""
    yield fresh.admin
    fresh.admin.execute(
        "grant insert, delete on public.chat_message_history to memchat_user;"
        " grant insert, update, delete on public.agent_long_term_memory to memchat_user"
    )


@pytest.fixture
async def api(fresh: Fresh, model: FakeOpenAI) -> AsyncIterator[ApiClient]:
    client = ApiClient(make_settings(fresh.api_url, model.url))
    yield client
    await client.aclose()


def bearer(api: ApiClient, fresh: Fresh) -> tuple[str, dict[str, str]]:
    """A user of the module's own database, and its token."""
    caller = UserFactory(fresh.admin).create()
    return str(caller.user_id), {"Authorization": f"Bearer {api.token_for(caller.user_id)}"}


def permission_logged(caplog: pytest.LogCaptureFixture, table: str) -> None:
    (record,) = [r for r in caplog.records if r.getMessage().startswith("database permission")]
    assert record.levelno == logging.ERROR
    assert record.db_error == f"permission denied for table {table}"
    assert record.sqlstate == "42501"


async def test_a_missing_grant_on_messages_is_a_500_not_a_404(
    api: ApiClient,
    fresh: Fresh,
    revoked: psycopg.Connection,
    model: FakeOpenAI,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="memchat")
    revoked.execute("revoke insert on public.chat_message_history from memchat_user")
    user_id, auth = bearer(api, fresh)

    r = await api.post("/chat", json={"message": SECRET}, headers=auth)

    assert_error(r, 500, "internal_error")
    permission_logged(caplog, "chat_message_history")
    assert SECRET not in caplog.text
    stored = revoked.execute(
        "select count(*) from public.chat_sessions where user_id = %s", (user_id,)
    ).fetchone()
    assert stored == (0,)


async def test_a_missing_grant_on_notes_is_a_500_not_a_404(
    api: ApiClient, fresh: Fresh, revoked: psycopg.Connection, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="memchat")
    revoked.execute("revoke insert, update on public.agent_long_term_memory from memchat_user")
    _, auth = bearer(api, fresh)

    r = await api.put("/memory", json={"agent_name": "default", "notes": "x"}, headers=auth)

    assert_error(r, 500, "internal_error")
    permission_logged(caplog, "agent_long_term_memory")
