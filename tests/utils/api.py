"""An in-process HTTP client for the app, with users and their tokens."""

from __future__ import annotations

import uuid
from typing import Any

import httpx

from memchat import bootstrap, devtokens
from memchat.config import Settings
from tests.utils.users import create_user


class ApiClient(httpx.AsyncClient):
    def __init__(self, settings: Settings, app: Any = None) -> None:
        self.app = app or bootstrap.app(settings)
        self.settings = settings
        super().__init__(
            transport=httpx.ASGITransport(app=self.app), base_url="http://memchat.test"
        )

    def token_for(self, user_id: uuid.UUID, **claims: Any) -> str:
        assert self.settings.supabase_jwt_secret
        return devtokens.mint(self.settings.supabase_jwt_secret, user_id, **claims)

    def new_user(self) -> tuple[uuid.UUID, dict[str, str]]:
        """Create a user in auth.users; returns (id, auth headers)."""
        user_id = uuid.uuid4()
        create_user(user_id)
        return user_id, {"Authorization": f"Bearer {self.token_for(user_id)}"}

    async def aclose(self) -> None:
        await self.app.state.memchat.close()
        await super().aclose()
