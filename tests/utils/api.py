"""An in-process HTTP client for the app, with users and their tokens."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import psycopg

from memchat import devtokens
from memchat.api.main import create_app
from memchat.config import Settings


class ApiClient(httpx.AsyncClient):
    def __init__(self, settings: Settings, app: Any = None) -> None:
        self.app = app or create_app(settings)
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
        with psycopg.connect(self.settings.database_url, autocommit=True) as conn:
            conn.execute(
                "insert into auth.users (id, aud, role, email) values"
                " (%s, 'authenticated', 'authenticated', %s)",
                (user_id, f"{user_id}@example.test"),
            )
        return user_id, {"Authorization": f"Bearer {self.token_for(user_id)}"}

    async def aclose(self) -> None:
        await self.app.state.memchat.close()
        await super().aclose()
