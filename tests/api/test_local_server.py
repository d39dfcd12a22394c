"""What only the local server (`memchat dev`: bootstrap.dev_app) adds: the
page's icon, and 401s that say where a local token comes from (there is no
Supabase to sign in to); the deployed app says neither."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest

from memchat import bootstrap
from memchat.config import Settings
from tests.utils.api import ApiClient
from tests.utils.chat_api import assert_error


@pytest.fixture
async def local(settings: Settings) -> AsyncIterator[ApiClient]:
    client = ApiClient(settings, app=bootstrap.dev_app(settings))
    yield client
    await client.aclose()


async def test_the_icon_is_served_for_both_names(local: ApiClient) -> None:
    for path in ("/favicon.ico", "/favicon.svg"):
        r = await local.get(path)
        assert r.status_code == 200, path
        assert r.headers["content-type"] == "image/svg+xml"
        assert r.text.startswith('<svg xmlns="http://www.w3.org/2000/svg"')


async def test_an_expired_token_points_to_memchat_token(local: ApiClient) -> None:
    user_id, _ = local.new_user()
    expired = local.token_for(user_id, exp=1)
    r = await local.get("/sessions", headers={"Authorization": f"Bearer {expired}"})
    body = assert_error(r, 401, "unauthorized")
    assert body["detail"] == "The access token has expired; get a new one with `memchat token`."
    assert r.headers["www-authenticate"] == "Bearer"


async def test_a_missing_token_points_to_memchat_token_too(local: ApiClient) -> None:
    body = assert_error(await local.get("/sessions"), 401, "unauthorized")
    assert body["detail"] == (
        "Send a valid Supabase access token as 'Authorization: Bearer <token>';"
        " locally, get a new one with `memchat token`."
    )


async def test_the_deployed_app_says_sign_in_again(api: ApiClient) -> None:
    expired = api.token_for(uuid.uuid4(), exp=1)
    r = await api.get("/sessions", headers={"Authorization": f"Bearer {expired}"})
    body = assert_error(r, 401, "unauthorized")
    assert body["detail"] == "The access token has expired; sign in again."
    assert (await api.get("/favicon.ico")).status_code == 404
