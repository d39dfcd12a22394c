"""Recall run: for a chat turn (begun with its context's load) and for a search.

A turn starts embedding its new message at once, alongside the load of its
context, and searches when both are done (memchat.recall, one round trip),
so recall adds the search and whatever the embedding takes beyond the
context load (docs/benchmarks.md compares this with embedding first and
loading and searching in one round trip). The message is embedded as a
query to search with, and what is stored with the turn as a document: the
same embedding, unless EMBEDDING_QUERY_PREFIX and EMBEDDING_DOCUMENT_PREFIX
differ (e5 models), when the document's is requested alongside. Either way
each user message is embedded once for storing, and recall compares only
embeddings of the model that made the query's.

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
from datetime import datetime
from typing import TYPE_CHECKING, Any

from memchat import store
from memchat.throttle import Bucket
from memchat.usecases.recall.follow_up import follow_up_query
from memchat.usecases.recall.meaning import embedding_text
from memchat.usecases.recall.query import recall_query

if TYPE_CHECKING:
    from memchat.config import Settings
    from memchat.model.client import EmbeddingKind, ModelClient
    from memchat.store.db import Database

logger = logging.getLogger(__name__)

OK, DISABLED, FAILED = "ok", "disabled", "failed"


@dataclass
class Recalled:
    status: str  # ok | disabled | failed
    hits: list[store.Hit] = field(default_factory=list)  # best first
    query: store.Embedding | None = None  # the new message's, as a query
    ms: float = 0.0  # what the turn waited for recall once its context was loaded
    embed_ms: float = 0.0  # a search's: the query's embedding (GET /memory/search)

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
        """Begin recall for a turn (`k` hits; 0: none): the embeddings are
        requested now. A turn that recalls nothing still embeds its message
        when recall is configured, so later turns can recall it; it never
        waits for that."""
        wanted = k > 0 or self.settings.memory_recall_k > 0
        if not wanted or self.column_fits is False:
            return PendingRecall(self, message, None, None, k)
        text = embedding_text(message)
        query = asyncio.create_task(self._embed(text, "query"))
        settings = self.settings
        if settings.embedding_query_prefix == settings.embedding_document_prefix:
            return PendingRecall(self, message, query, None, k)  # one embedding serves both
        document = asyncio.create_task(self._embed(text, "document"))
        return PendingRecall(self, message, query, document, k)

    async def search(
        self,
        caller: store.Caller,
        text: str,
        *,
        agent_name: str,
        k: int,
        as_of: datetime | None = None,
    ) -> Recalled:
        """The caller's exchanges best matching `text`, as a turn recalls them
        (the same embedding, statement and rules) but over every live session,
        its window included, with time expressions in `text` read relative to
        `as_of` (None: now): what GET /memory/search answers. `ms` is the search's own time,
        `embed_ms` the query's embedding's."""
        embed_started = time.perf_counter()
        query = await self.query_embedding(caller, embedding_text(text))
        embed_ms = (time.perf_counter() - embed_started) * 1000
        if query is None:
            return Recalled(FAILED)
        started = time.perf_counter()
        hits = await self._hits(
            caller,
            text,
            query,
            session_id=None,
            agent_name=agent_name,
            window=0,
            k=k,
            as_of=as_of,
            throttle=Bucket.READ,
        )
        return Recalled(OK, hits, query, (time.perf_counter() - started) * 1000, embed_ms)

    async def query_embedding(self, caller: store.Caller, text: str) -> store.Embedding | None:
        """`text` embedded as a query, as search() does; None when it cannot
        be (the provider failed, or the stored column does not fit)."""
        if self.column_fits is False:
            return None
        query = await self._embed(text, "query")
        if query is None or not await self.check_column(caller):
            return None
        return query

    async def _hits(
        self,
        caller: store.Caller,
        text: str,
        query: store.Embedding,
        *,
        session_id: uuid.UUID | None,
        agent_name: str,
        window: int,
        k: int,
        as_of: datetime | None,
        throttle: Bucket | None = None,
    ) -> list[store.Hit]:
        """memchat.recall for `text` (its embedding `query`)."""
        asked = recall_query(
            self.settings,
            text,
            query,
            agent_name=agent_name,
            k=k,
            session_id=session_id,
            window=window,
            as_of=as_of,
        )
        return await store.recall(self.db, caller, asked, throttle=throttle)

    async def _embed(self, text: str, kind: EmbeddingKind) -> store.Embedding | None:
        from memchat.model.client import EmbeddingUnavailable

        try:
            vector = await self.model.embed(text, kind)
        except EmbeddingUnavailable:
            return None  # the client logged why
        return store.Embedding(self.model.embedding_model, vector)

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
    message: str  # the turn's new message
    task: asyncio.Task[store.Embedding | None] | None  # the query's embedding
    # The document's, when it is not the query's (the prefixes differ).
    document: asyncio.Task[store.Embedding | None] | None
    k: int

    def cancel(self) -> None:
        """The turn ended without recall (a replay, an error)."""
        for task in (self.task, self.document):
            if task is not None:
                task.cancel()

    async def embedding_to_store(
        self, caller: store.Caller, recalled: Recalled
    ) -> store.Embedding | None:
        """The message's embedding for the turn's record, as a document: the
        query's (when no prefix tells them apart) that recall used, else the
        one requested at the start (a turn that recalled nothing has usually
        got it by now, while the model answered; else it waits at most
        EMBEDDING_TIMEOUT_SECONDS), and only if the stored column has its size."""
        if self.document is None and recalled.query is not None:
            return recalled.query
        task = self.document or self.task
        if task is None or task.cancelled():
            return None
        embedding = await task
        if embedding is None or not await self.recall.check_column(caller):
            return None
        return embedding

    async def finish(
        self,
        caller: store.Caller,
        *,
        session_id: uuid.UUID | None,
        agent_name: str,
        window: int,
        previous: list[dict[str, Any]] | None = None,
    ) -> Recalled:
        """The hits for this turn, once its context is loaded (`previous`: its
        window, oldest first). A follow-up too short to mean much alone
        (follow_up.py) searches with the previous exchange too:
        that query is embedded now, once the window is known, so such a turn
        waits for a second embedding; the message's own is still what is
        stored."""
        if self.k <= 0:
            return Recalled(DISABLED)
        if self.task is None:
            return Recalled(FAILED)
        started = time.perf_counter()
        query = own = await self.task
        if query is None or not await self.recall.check_column(caller):
            return Recalled(FAILED, ms=(time.perf_counter() - started) * 1000)
        text = self.message
        expanded = follow_up_query(self.message, previous or [])
        if expanded is not None:
            widened = await self.recall._embed(embedding_text(expanded), "query")
            if widened is not None:
                query, text = widened, expanded
        hits = await self.recall._hits(
            caller,
            text,
            query,
            session_id=session_id,
            agent_name=agent_name,
            window=window,
            k=self.k,
            as_of=None,
        )
        return Recalled(OK, hits, own, (time.perf_counter() - started) * 1000)
