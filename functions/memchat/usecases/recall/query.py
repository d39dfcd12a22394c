"""Where recall's signals meet: the one query memchat.recall is asked
(store.RecallQuery), from a text, its embedding and the settings that shape
them (MEMORY_RECALL_WORDS, MEMORY_RECALL_TIME, MEMORY_RECALL_MIN_SCORE,
MEMORY_RECALL_DUPLICATE_SCORE)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from memchat import store

if TYPE_CHECKING:
    from memchat.config import Settings


def recall_query(
    settings: Settings,
    text: str,
    embedding: store.Embedding,
    *,
    agent_name: str,
    k: int,
    session_id: uuid.UUID | None = None,
    window: int = 0,
    as_of: datetime | None = None,
) -> store.RecallQuery:
    """The query for `text` (its embedding `embedding`): by meaning always;
    by its words with MEMORY_RECALL_WORDS; with MEMORY_RECALL_TIME, favouring
    the period a time expression in it names, read relative to `as_of`
    (None: now)."""
    period = None
    if settings.memory_recall_time:
        # Its patterns compile on first use, not at cold start.
        from memchat.usecases.recall import periods

        period = periods.period_in(text, as_of or datetime.now(UTC))
    return store.RecallQuery(
        embedding=embedding,
        agent_name=agent_name,
        k=k,
        min_score=settings.memory_recall_min_score,
        duplicate_score=settings.memory_recall_duplicate_score,
        session_id=session_id,
        window=window,
        text=text if settings.memory_recall_words else None,
        period=period,
    )
