"""Recall: the caller's earlier exchanges with an agent, found by meaning.

A turn starts embedding its new message at once, alongside the load of its
context, and searches when both are done (memchat.recall, one round trip),
so recall adds the search and whatever the embedding takes beyond the
context load (docs/benchmarks.md compares this with embedding first and
loading and searching in one round trip). The embedding is stored with the
turn, so each user message is embedded exactly once.

An embedding that fails or times out (EMBEDDING_TIMEOUT_SECONDS) never fails
the turn: it answers without recall and stores the message without an
embedding; `memory.recall_status` says `failed`.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from memchat import store

if TYPE_CHECKING:
    from memchat.config import Settings
    from memchat.model.client import ModelClient
    from memchat.store.db import Database

logger = logging.getLogger(__name__)

OK, DISABLED, FAILED = "ok", "disabled", "failed"


@dataclass
class Recalled:
    status: str  # ok | disabled | failed
    hits: list[store.Hit] = field(default_factory=list)  # best first
    query: list[float] | None = None  # the new message's embedding, stored with the turn
    ms: float = 0.0  # what the turn waited for recall once its context was loaded

    def as_list(self) -> list[dict[str, object]]:
        """`memory.recalled`: what was used, never the text."""
        return [
            {
                "session_id": str(hit.session_id),
                "message_id": hit.message_id,
                "score": round(hit.score, 4),
                "created_at": hit.created_at.isoformat(),
            }
            for hit in self.hits
        ]


NOT_RECALLED = Recalled(DISABLED)


@dataclass
class Recall:
    """Recall for a process: its settings, and whether the stored column fits them."""

    db: Database
    model: ModelClient
    settings: Settings
    # None until checked (at start in Lambda, else on the first turn that recalls).
    column_fits: bool | None = None

    def start(self, message: str, k: int) -> PendingRecall:
        """Begin recall for a turn (`k` hits; 0: none): the embedding is requested
        now. A turn that recalls nothing still embeds its message when recall is
        configured, so later turns can recall it; it never waits for that."""
        wanted = k > 0 or self.settings.memory_recall_k > 0
        if not wanted or self.column_fits is False:
            return PendingRecall(self, None, k)
        return PendingRecall(self, asyncio.create_task(self._embed(message)), k)

    async def _embed(self, message: str) -> list[float] | None:
        from memchat.model.client import EmbeddingUnavailable

        try:
            return await self.model.embed(message)
        except EmbeddingUnavailable:
            return None  # the client logged why

    def check_at_start(self) -> None:
        """Refuse to start (ConfigError) when the stored embeddings are not
        EMBEDDING_DIMENSIONS long. If the database cannot be reached now, the
        first turn that recalls checks instead (an outage stays a 503)."""
        import psycopg

        from memchat.config import ConfigError

        if not (self.settings.memory_enabled and self.settings.memory_recall_k > 0):
            return
        try:
            with store.connect(self.settings.database_url) as conn:
                stored = store.embedding_dimensions(conn)
        except psycopg.OperationalError:
            logger.warning("could not check the embedding column at start; the first turn will")
            return
        wanted = self.settings.embedding_dimensions
        if stored != wanted:
            raise ConfigError(
                f"invalid configuration: EMBEDDING_DIMENSIONS is {wanted}"
                f" but the database stores vector({stored}) embeddings"
                " (memchat.message_embeddings.embedding): set EMBEDDING_DIMENSIONS to"
                f" {stored}, or change the column (docs/deploy.md, 'Recall')."
            )
        self.column_fits = True

    async def check_column(self, caller: store.Caller) -> bool:
        """Whether the stored embeddings have EMBEDDING_DIMENSIONS (checked once)."""
        if self.column_fits is None:
            stored = await store.stored_embedding_dimensions(self.db, caller)
            self.column_fits = stored == self.settings.embedding_dimensions
            if not self.column_fits:
                logger.error(
                    "recall is off: EMBEDDING_DIMENSIONS does not match the stored column",
                    extra={
                        "embedding_dimensions": self.settings.embedding_dimensions,
                        "stored_dimensions": stored,
                    },
                )
        return self.column_fits


@dataclass
class PendingRecall:
    recall: Recall
    task: asyncio.Task[list[float] | None] | None
    k: int

    def cancel(self) -> None:
        """The turn ended without recall (a replay, an error)."""
        if self.task is not None:
            self.task.cancel()

    async def embedding_to_store(
        self, caller: store.Caller, recalled: Recalled
    ) -> list[float] | None:
        """The message's embedding for the turn's record: the one recall used,
        else the one requested at the start (a turn that recalled nothing has
        usually got it by now, while the model answered; else it waits at most
        EMBEDDING_TIMEOUT_SECONDS), and only if the stored column has its size."""
        if recalled.query is not None:
            return recalled.query
        if self.task is None or self.task.cancelled():
            return None
        query = await self.task
        if query is None or not await self.recall.check_column(caller):
            return None
        return query

    async def finish(
        self,
        caller: store.Caller,
        *,
        session_id: uuid.UUID | None,
        agent_name: str,
        window: int,
    ) -> Recalled:
        """The hits for this turn, once its context is loaded."""
        if self.k <= 0:
            return Recalled(DISABLED)
        if self.task is None:
            return Recalled(FAILED)
        started = time.perf_counter()
        query = await self.task
        if query is None or not await self.recall.check_column(caller):
            return Recalled(FAILED, ms=(time.perf_counter() - started) * 1000)
        hits = await store.recall(
            self.recall.db,
            caller,
            session_id=session_id,
            agent_name=agent_name,
            window=window,
            query=query,
            k=self.k,
            min_score=self.recall.settings.memory_recall_min_score,
        )
        return Recalled(OK, hits, query, (time.perf_counter() - started) * 1000)
