"""The rolling summary worker: each long session's summary of what left its window.

A chat turn never summarizes. When a turn leaves more than
SUMMARY_TRIGGER_MESSAGES messages beyond the window outside the session's
summary, it queues the session (memchat.summary_queue, in the turn's own
transaction). This worker, run on a schedule (the SummaryFunction, `memchat
summarize`, `memchat dev` in the background), claims due sessions a batch at
a time and refreshes each summary incrementally: the model gets the previous
summary plus only the messages that left the window since (at most
SUMMARY_CHUNK_MESSAGES; a longer backlog takes several refreshes), so a
refresh costs the same however long the session is.

A pass catches up: it refreshes chunk after chunk until the summary reaches
the window's start (while its lease leaves time for another model call), so
a burst of turns never leaves a lasting hole between summary and window.

Who sees what: the worker logs in as `memchat_worker`, which may call the
memchat.summary_* functions and nothing else. A claim hands it a lease per
due session; every read and write names the lease, so the worker sees only
the sessions the queue handed it, only while its lease lives (the database
checks; supabase/schemas/functions/limits.sql).

Claims: a claim (FOR UPDATE SKIP LOCKED, one short transaction) leases the
session for a few model calls, so two workers never summarize one session at
once, and a turn recording meanwhile waits at most for that short
transaction. A model failure keeps the old summary and retries later,
backing off; after SUMMARY_MAX_ATTEMPTS failures in a row the session is
skipped (logged, counted) until its next turn.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from memchat import store
from memchat.errors import UpstreamError, UpstreamTimeout
from memchat.prompts.summary import SUMMARY_INSTRUCTIONS
from memchat.usecases.cleanup import TimeBudget

if TYPE_CHECKING:
    from memchat.config import Settings
    from memchat.model.client import ModelClient
    from memchat.store.db import Database

logger = logging.getLogger(__name__)

# Sessions summarized at once: the model calls overlap, the database work
# takes turns on the worker's connection.
CONCURRENCY = 4
# Retries back off: 1, 2, 4, ... minutes, at most 6 hours.
BACKOFF_FIRST_SECONDS = 60.0
BACKOFF_MAX_SECONDS = 6 * 3600.0
# Time a Lambda keeps back to finish its summaries, log and return.
LAMBDA_RESERVE_SECONDS = 5.0
# A summary of about this many words fits SUMMARY_MAX_TOKENS in English.
WORDS_PER_TOKEN = 0.75
# A lease lasts one model call and this much more: a pass catching up on a
# backlog starts another chunk only while a whole call still fits.
LEASE_MARGIN_SECONDS = 60.0


@dataclass
class SummaryRun:
    summarized: int = 0
    failed: int = 0
    gave_up: int = 0
    skipped: int = 0  # nothing left to summarize (cleared, deleted, caught up)
    remembered: int = 0  # summaries kept as durable memories
    rounds: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    lag_seconds: float | None = None  # the oldest due session's wait, at the start
    duration_ms: float = 0.0
    finished: bool = False  # nothing due was left

    def as_dict(self) -> dict[str, Any]:
        out = dict(vars(self))
        out["duration_ms"] = round(self.duration_ms, 1)
        if self.lag_seconds is not None:
            out["lag_seconds"] = round(self.lag_seconds, 1)
        return out


def summary_prompt(source: store.SummarySource, max_tokens: int) -> list[dict[str, str]]:
    lines = [
        f"{'User' if m.role == 'user' else 'Assistant'}: {' '.join(m.text.split())}"
        for m in source.messages
    ]
    text = "\n".join(
        [
            "Summary so far:",
            source.summary or "(none yet)",
            "",
            "New messages:",
            *lines,
        ]
    )
    max_words = max(20, int(max_tokens * WORDS_PER_TOKEN))
    return [
        {"role": "system", "content": SUMMARY_INSTRUCTIONS.format(max_words=max_words)},
        {"role": "user", "content": text},
    ]


@dataclass
class Summarizer:
    db: Database  # logged in as memchat_worker
    model: ModelClient
    settings: Settings
    clock: Callable[[], float] = time.monotonic
    _next_start: float = field(default=0.0, init=False, repr=False)
    _dimensions: int | None = field(default=None, init=False, repr=False)

    async def close(self) -> None:
        await self.db.close()
        await self.model.close()

    async def run(
        self,
        *,
        max_seconds: float | None = None,
        remaining_ms: Callable[[], int] | None = None,
    ) -> SummaryRun:
        """Summarize due sessions until none is left or the time is up.

        `remaining_ms` is the Lambda context's; `max_seconds` stops a CLI run
        from starting new rounds after that long.
        """
        started = self.clock()
        run = SummaryRun(lag_seconds=await store.summary_lag(self.db))

        budget = TimeBudget(max_seconds, remaining_ms, LAMBDA_RESERVE_SECONDS)

        def seconds_left() -> float:
            return budget.seconds_left(lambda: self.clock() - started)

        # In Lambda a round must finish before the function's timeout: start
        # one only while a model call still fits. `max_seconds` (the CLI)
        # only stops new rounds.
        reserve = self._call_seconds() if remaining_ms is not None else 0.0
        while seconds_left() > reserve:
            due = await store.claim_due_summaries(
                self.db, limit=self.settings.summary_batch_size, lease_seconds=self._lease_seconds()
            )
            if not due:
                run.finished = True
                break
            run.rounds += 1
            slots = asyncio.Semaphore(CONCURRENCY)
            await asyncio.gather(*(self._in_slot(slots, item, run) for item in due))
        run.duration_ms = (self.clock() - started) * 1000
        logger.info("summaries", extra={"summaries": run.as_dict()})
        return run

    def _due_after(self) -> int:
        """Messages outside a session's summary that make it due (as turns count)."""
        return self.settings.memory_max_history_messages + self.settings.summary_trigger_messages

    def _call_seconds(self) -> float:
        """The longest one summary's model call may take, retries included."""
        settings = self.settings
        return settings.openai_timeout_seconds * (settings.openai_max_retries + 1)

    def _lease_seconds(self) -> float:
        """How long a claimed session is this worker's: one model call and margin
        (more chunks of a backlog while the margin lasts)."""
        return self._call_seconds() + LEASE_MARGIN_SECONDS

    async def _in_slot(
        self, slots: asyncio.Semaphore, item: store.DueSummary, run: SummaryRun
    ) -> None:
        async with slots:
            await self._pace()
            await self._summarize(item, run)

    async def _pace(self) -> None:
        """Start summaries at most SUMMARY_MAX_PER_SECOND (a background job must
        not crowd out the chat turns, whatever the model's speed)."""
        rate = self.settings.summary_max_per_second
        if rate <= 0:
            return
        now = self.clock()
        start = max(now, self._next_start)
        self._next_start = start + 1.0 / rate
        if start > now:
            await asyncio.sleep(start - now)

    async def _summarize(self, item: store.DueSummary, run: SummaryRun) -> None:
        """One pass over a leased session: chunks until its summary reaches the
        window's start, then off the queue (or queued again if still due)."""
        lease_ends = self.clock() + self._lease_seconds()
        chunks = 0
        summary = ""
        while True:
            source = await store.summary_source(
                self.db,
                item,
                window=self.settings.memory_max_history_messages,
                chunk=self.settings.summary_chunk_messages,
            )
            if source is None:
                break
            stored = await self._refresh(item, source, run)
            if stored is None:
                return  # failed: backing off, or given up
            chunks += 1
            summary = stored or summary
            if not stored or lease_ends - self.clock() < self._call_seconds():
                break
        if chunks == 0:
            run.skipped += 1
        if summary:
            await self._remember(item, summary, run)
        await store.summary_done(self.db, item, due_after=self._due_after())

    async def _remember(self, item: store.DueSummary, summary: str, run: SummaryRun) -> None:
        """The session's latest summary kept as its durable memory, embedded
        as a document (found by words alone if it cannot be)."""
        from memchat.model.client import EmbeddingUnavailable

        if self._dimensions is None:
            self._dimensions = await store.stored_embedding_dimensions(self.db, None)
        try:
            embedding: list[float] | None = await self.model.embed(summary, "document")
        except EmbeddingUnavailable:
            embedding = None
        if embedding is not None and len(embedding) != self._dimensions:
            embedding = None  # another size than the column's: words only
        model = self.model.embedding_model  # the offline stand-in's own name, as the backfill's
        if await store.remember_summary(self.db, item, summary, model, embedding):
            run.remembered += 1

    async def _refresh(
        self, item: store.DueSummary, source: store.SummarySource, run: SummaryRun
    ) -> str | None:
        """One chunk: the summary stored ("": not stored, the session changed
        meanwhile), None when the model failed (recorded)."""
        settings = self.settings
        prompt = summary_prompt(source, settings.summary_max_tokens)
        try:
            completion = await self.model.complete(prompt, max_tokens=settings.summary_max_tokens)
        except (UpstreamError, UpstreamTimeout) as exc:
            await self._failed(item, run, type(exc).__name__)
            return None
        from memchat.model.tokens import counter_for_model

        counter = counter_for_model(self.model.model)
        text = counter.truncate(completion.content.strip(), settings.summary_max_tokens)
        if not text:
            await self._failed(item, run, "empty summary")
            return None
        stored = await store.save_summary(self.db, source, text)
        run.summarized += 1
        run.tokens_in += completion.usage.get("prompt_tokens", 0)
        run.tokens_out += completion.usage.get("completion_tokens", 0)
        return text if stored else ""

    async def _failed(self, item: store.DueSummary, run: SummaryRun, reason: str) -> None:
        attempts = item.attempts + 1
        give_up = attempts >= self.settings.summary_max_attempts
        retry_in = min(BACKOFF_FIRST_SECONDS * 2 ** (attempts - 1), BACKOFF_MAX_SECONDS)
        await store.summary_failed(self.db, item, retry_in=None if give_up else retry_in)
        run.failed += 1
        if give_up:
            run.gave_up += 1
            logger.error(
                "summary given up until the session's next turn",
                extra={"session_id": str(item.session_id), "attempts": attempts, "reason": reason},
            )
        else:
            logger.warning(
                "summary failed; will retry",
                extra={
                    "session_id": str(item.session_id),
                    "attempts": attempts,
                    "retry_in_seconds": retry_in,
                    "reason": reason,
                },
            )
