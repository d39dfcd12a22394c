"""What the app holds for its lifetime: settings, database, verifier, model.

Created once per process (a warm Lambda instance reuses all of it); nothing
here does I/O until a request needs it.
"""

from __future__ import annotations

from dataclasses import dataclass

from memchat.auth import TokenVerifier
from memchat.config import Settings
from memchat.db import Database
from memchat.model.client import ModelClient
from memchat.usecases.chat import ChatService


@dataclass
class AppState:
    settings: Settings
    db: Database
    verifier: TokenVerifier
    model: ModelClient
    chat: ChatService

    @classmethod
    def build(cls, settings: Settings) -> AppState:
        db = Database(settings.database_url, settings.db_max_connections)
        http_client = None
        if settings.offline_model:
            from memchat.model import offline

            http_client = offline.http_client()
        model = ModelClient(settings, http_client=http_client)
        return cls(
            settings=settings,
            db=db,
            verifier=TokenVerifier(settings),
            model=model,
            chat=ChatService(db=db, model=model, settings=settings),
        )

    async def close(self) -> None:
        await self.db.close()
        await self.model.close()
