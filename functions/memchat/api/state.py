"""What the app holds for its lifetime: settings, database, verifier, model.

Made once per process by memchat.bootstrap.services (a warm Lambda instance
reuses all of it); nothing
here does I/O until a request needs it. The model client and the chat use
case exist only where the chat routes are served (ROUTE_GROUPS): the
sessions and export functions have no model key and never build them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from memchat.auth import TokenVerifier
    from memchat.config import Settings
    from memchat.model.client import ModelClient
    from memchat.store.db import Database
    from memchat.usecases.chat import ChatService


@dataclass
class AppState:
    settings: Settings
    db: Database
    verifier: TokenVerifier
    model: ModelClient | None = None
    chat_service: ChatService | None = None

    @property
    def chat(self) -> ChatService:
        """The chat use case; only a process that serves chat has one."""
        if self.chat_service is None:
            raise RuntimeError("this process does not serve the chat routes (ROUTE_GROUPS)")
        return self.chat_service

    async def close(self) -> None:
        await self.db.close()
        if self.model is not None:
            await self.model.close()
