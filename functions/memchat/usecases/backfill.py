"""The embedding backfill: embeddings for stored messages no turn embedded.

A chat turn embeds its own user message. Messages stored another way (an
import: POST /sessions/import queues its sessions, memchat.queue_embeddings)
or whose embedding is of another model or missing (`memchat db reembed`
queues every such session) are embedded here, by the worker that also
refreshes the rolling summaries (the SummaryFunction, `memchat summarize`,
`memchat dev` in the background), after them.

A run claims queued sessions a group at a time (a lease each, FOR UPDATE
SKIP LOCKED: two workers never take the same session) and reads their
messages that lack an embedding of OPENAI_EMBEDDING_MODEL, oldest first,
packing them into requests of EMBEDDING_BATCH_SIZE texts (a request may
span sessions: imported sessions are often short). At most CONCURRENCY
requests are in flight; the reading waits for a free one, so a session of
any length costs bounded memory. Each request's embeddings (documents, the
text `embedding_text` gives) are stored as it returns. A session
leaves the queue once nothing in it lacks an embedding; one cut short (its
lease running out) stays queued, ready for the next round.

Fact keys (MEMORY_RECALL_FACTS): a message that says several things also
gets an embedding of each sentence in which the user speaks of themselves
(`rule`: fact_sentences), or of each fact the chat model finds it
states (`model`: one chat request per session's messages in an embeddings
request, up to memchat.prompts.facts.FACTS_MESSAGES_PER_CALL of them, at most
FACTS_CONCURRENCY in flight; an answer that cannot be read gets the rule's
sentences instead, logged), embedded in the same request as the documents.
A turn stores its message's own embedding and leaves the fact keys to this
worker (its session is queued by the embedding's insert, migration
supabase/schemas/functions/recall.sql), so a turn never waits for them.

A failed request (the provider down, a bad answer; with `model`, a facts
request the chat model failed) fails the sessions it held: they keep what
was stored and are retried later, backing off as the summary worker does
(1, 2, 4, ... minutes, at most 6 hours); after MAX_ATTEMPTS failures in a
row a session is given up (logged) until it is queued again.

Who sees what: the worker logs in as `memchat_worker`, which may call the
memchat.embedding_* functions and nothing else; every read and write names
a live lease (supabase/schemas/functions/embeddings.sql). `memchat db reembed` runs
the same class as the table's owner.

Nothing is embedded while the stored column's size is not
EMBEDDING_DIMENSIONS (the run logs an error and stops): it could not be stored.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from memchat import store
from memchat.errors import UpstreamError, UpstreamTimeout
from memchat.prompts.facts import facts_calls, facts_max_tokens, facts_prompt, read_facts
from memchat.usecases.cleanup import TimeBudget
from memchat.usecases.recall.facts import fact_sentences, memory_sentences
from memchat.usecases.recall.meaning import embedding_text
from memchat.usecases.summarize import (
    BACKOFF_FIRST_SECONDS,
    BACKOFF_MAX_SECONDS,
    LAMBDA_RESERVE_SECONDS,
    LEASE_MARGIN_SECONDS,
)

if TYPE_CHECKING:
    import psycopg

    from memchat.config import Settings
    from memchat.model.client import ModelClient
    from memchat.store.db import Database

logger = logging.getLogger(__name__)

# Embedding requests in flight at once: the provider works on them in
# parallel; the database work takes turns on the worker's connection.
CONCURRENCY = 4
# Sessions leased per round.
CLAIM_SESSIONS = 32
# Failures in a row after which a session waits to be queued again.
MAX_ATTEMPTS = 8
# Facts requests to the chat model in flight at once (MEMORY_RECALL_FACTS=model).
FACTS_CONCURRENCY = 4

# A fact key before it is embedded: (its message, its ordinal, its text).
FactText = tuple[store.Unembedded, int, str]


@dataclass
class EmbeddingRun:
    embedded: int = 0  # messages stored with an embedding
    memories: int = 0  # memories without one embedded (imported, resized)
    sessions: int = 0  # sessions a pass went through
    failed: int = 0  # sessions whose pass failed (retried later)
    gave_up: int = 0
    rounds: int = 0
    # MEMORY_RECALL_FACTS=model: the chat requests for facts, the tokens they
    # read and wrote (the cost), and those whose answer could not be read.
    fact_requests: int = 0
    fact_tokens_in: int = 0
    fact_tokens_out: int = 0
    facts_unreadable: int = 0
    # Young recall-key partitions analysed at the end of the run (statistics
    # for recall's plans; supabase/schemas/functions/partitions.sql).
    analysed: int = 0
    duration_ms: float = 0.0
    finished: bool = False  # nothing queued was left
    # Why nothing was embedded, when the settings cannot be (else None).
    refused: str | None = None

    def as_dict(self) -> dict[str, Any]:
        out = dict(vars(self))
        out["duration_ms"] = round(self.duration_ms, 1)
        return out


@dataclass
class Embedder:
    db: Database  # logged in as memchat_worker (or the owner: `memchat db reembed`)
    model: ModelClient
    settings: Settings
    clock: Callable[[], float] = time.monotonic
    # Told how many messages each stored request added (a progress bar).
    on_stored: Callable[[int], None] | None = None
    # The facts requests' slots, made by each run (on its event loop).
    _fact_slots: asyncio.Semaphore = field(init=False, repr=False)

    async def close(self) -> None:
        await self.db.close()
        await self.model.close()

    async def run(
        self,
        *,
        max_seconds: float | None = None,
        remaining_ms: Callable[[], int] | None = None,
    ) -> EmbeddingRun:
        """Embed what is queued until nothing is left or the time is up.

        `remaining_ms` is the Lambda context's; `max_seconds` stops a CLI run
        from starting new rounds after that long.
        """
        started = self.clock()
        run = EmbeddingRun()
        self._fact_slots = asyncio.Semaphore(FACTS_CONCURRENCY)

        budget = TimeBudget(max_seconds, remaining_ms, LAMBDA_RESERVE_SECONDS)

        def seconds_left() -> float:
            return budget.seconds_left(lambda: self.clock() - started)

        run.refused = await self._refusal()
        # In Lambda a round must finish before the function's timeout: start
        # one only while a request still fits.
        reserve = self._call_seconds() if remaining_ms is not None else 0.0
        while run.refused is None and seconds_left() > reserve:
            due = await store.claim_embeddings(
                self.db, limit=CLAIM_SESSIONS, lease_seconds=self._lease_seconds()
            )
            if not due:
                run.finished = True
                break
            run.rounds += 1
            if not await self._round(due, run):
                break  # stuck (every lease lost?): the next run takes over
        if run.refused is None and seconds_left() > reserve:
            run.memories = await self._embed_memories(seconds_left, reserve)
        if run.refused is None:
            # Statistics for the young key partitions this run or turns grew
            # (recall's plans need them; supabase/schemas/functions/partitions.sql).
            run.analysed += await store.embedding_statistics(self.db)
        run.duration_ms = (self.clock() - started) * 1000
        logger.info("embeddings", extra={"embeddings": run.as_dict()})
        return run

    async def _embed_memories(self, seconds_left: Callable[[], float], reserve: float) -> int:
        """Embed the memories that have no embedding (imported with their
        session gone, or after the column was resized), a request at a time
        while time is left; a failed request ends the pass (the client logged
        why; the next run goes on). Returns how many were stored."""
        from memchat.model.client import EmbeddingUnavailable

        size = self.settings.embedding_batch_size
        after = stored = 0
        while seconds_left() > reserve:
            page = await store.unembedded_memories(self.db, after=after, limit=size)
            if not page:
                break
            try:
                vectors = await self.model.embed_many([m.text for m in page], "document")
            except EmbeddingUnavailable:
                break
            stored += await store.save_memory_embeddings(
                self.db, self.model.embedding_model, page, vectors
            )
            after = page[-1].id
            if len(page) < size:
                break
        return stored

    async def _refusal(self) -> str | None:
        """Why nothing can be embedded now (None: it can): the stored column's
        size is not EMBEDDING_DIMENSIONS."""
        stored = await store.stored_embedding_dimensions(self.db, None)
        wanted = self.settings.embedding_dimensions
        if stored == wanted:
            return None
        reason = (
            f"the database stores vector({stored}) embeddings but EMBEDDING_DIMENSIONS is"
            f" {wanted}: run `memchat db reembed --dimensions {wanted}`, or set"
            f" EMBEDDING_DIMENSIONS to {stored}"
        )
        logger.error("the embedding backfill is off: %s", reason)
        return reason

    def _call_seconds(self) -> float:
        """The longest one request may take: an embeddings request
        (OPENAI_TIMEOUT_SECONDS), after the chat model's facts request with its
        retries when the model writes the facts."""
        settings = self.settings
        seconds = settings.openai_timeout_seconds
        if settings.memory_recall_facts == "model":
            seconds += settings.openai_timeout_seconds * (settings.openai_max_retries + 1)
        return seconds

    def _lease_seconds(self) -> float:
        return self._call_seconds() + LEASE_MARGIN_SECONDS

    async def _round(self, due: list[store.DueEmbeddings], run: EmbeddingRun) -> bool:
        """One pass over the leased sessions: their messages read, packed into
        requests, embedded and stored; then each session settled. Returns
        whether anything moved (a message stored, a session failed or done)."""
        lease_ends = self.clock() + self._lease_seconds()
        size = self.settings.embedding_batch_size
        slots = asyncio.Semaphore(CONCURRENCY)
        failed: set[uuid.UUID] = set()
        sent: list[asyncio.Task[None]] = []
        pending: list[store.Unembedded] = []
        embedded = run.embedded

        async def send(request: list[store.Unembedded]) -> None:
            await slots.acquire()  # the reading waits here while CONCURRENCY are in flight
            sent.append(asyncio.create_task(self._request(request, slots, failed, run)))

        for item in due:
            after = 0
            # A page more only while a request still fits in the lease.
            while lease_ends - self.clock() > self._call_seconds():
                page = await store.unembedded(
                    self.db, item, model=self.model.embedding_model, after=after, limit=size
                )
                pending.extend(page)
                while len(pending) >= size:
                    await send(pending[:size])
                    del pending[:size]
                if len(page) < size:
                    break
                after = page[-1].id
        if pending:
            await send(pending)
        await asyncio.gather(*sent)
        left = 0
        for item in due:
            if item.lease in failed:
                await self._failed(item, run)
            elif await store.embeddings_done(self.db, item, model=self.model.embedding_model):
                left += 1
            run.sessions += 1
        return bool(run.embedded > embedded or failed or left)

    async def _request(
        self,
        request: list[store.Unembedded],
        slots: asyncio.Semaphore,
        failed: set[uuid.UUID],
        run: EmbeddingRun,
    ) -> None:
        """Embed one request's messages as documents and store them; a failure
        fails the sessions they came from."""
        from memchat.model.client import EmbeddingUnavailable

        model = self.model
        # Fact keys are a user message's: an answer is one key, its own.
        asked = [m for m in request if m.asked]
        try:
            facts = await self._fact_texts(asked, run)
            if facts is None:
                failed.update(m.lease for m in request)  # logged in _written_facts
                return
            # One request: the documents still missing, every fact key, then
            # the memories' sentences no key above is (a memory that is its
            # whole message, embedded before, takes that embedding: None).
            documents = [m for m in request if not m.embedded]
            texts = [embedding_text(m.text) for m in documents]
            texts += [text for _, _, text in facts]
            memories = _memory_texts(request)
            known = set(texts)
            texts += list(
                dict.fromkeys(t for m, _, t in memories if t not in known and not _whole(m, t))
            )
            try:
                vectors = await model.embed_many(texts, "document")
            except EmbeddingUnavailable:
                failed.update(m.lease for m in request)  # the client logged why
                return
            name = model.embedding_model
            embeddings = [store.Embedding(name, v) for v in vectors[: len(documents)]]
            stored = await store.save_embeddings(self.db, documents, embeddings)
            keys = [
                (m, i, v)
                for (m, i, _), v in zip(
                    facts, vectors[len(documents) : len(documents) + len(facts)], strict=True
                )
            ]
            await store.save_facts(self.db, asked, name, keys)
            vector_of = dict(zip(texts, vectors, strict=True))
            await store.save_memories(
                self.db, name, [(m, i, t, vector_of.get(t)) for m, i, t in memories]
            )
            run.embedded += stored
            if self.on_stored is not None:
                self.on_stored(stored)
        finally:
            slots.release()

    async def _fact_texts(
        self, asked: list[store.Unembedded], run: EmbeddingRun
    ) -> list[FactText] | None:
        """The fact keys of a request's user messages, as MEMORY_RECALL_FACTS
        makes them; None when the chat model failed one of its facts requests."""
        mode = self.settings.memory_recall_facts
        if mode == "off":
            return []
        if mode == "rule":
            return _rule_facts(asked)
        sessions: dict[uuid.UUID, list[store.Unembedded]] = {}
        for m in asked:
            sessions.setdefault(m.lease, []).append(m)
        calls = [
            [said[index] for index in indexes]
            for said in sessions.values()
            for indexes in facts_calls([m.text for m in said])
        ]
        written = await asyncio.gather(*(self._written_facts(call, run) for call in calls))
        if any(facts is None for facts in written):
            return None
        return [fact for facts in written if facts is not None for fact in facts]

    async def _written_facts(
        self, said: list[store.Unembedded], run: EmbeddingRun
    ) -> list[FactText] | None:
        """One facts request: the facts the chat model finds `said` (one
        session's messages) to state, each a key of its message; the rule's
        sentences when its answer cannot be read; None when the model failed."""
        prompt = facts_prompt([m.text for m in said])
        async with self._fact_slots:
            try:
                completion = await self.model.complete(
                    prompt, max_tokens=facts_max_tokens(len(said))
                )
            except (UpstreamError, UpstreamTimeout) as exc:
                logger.warning(
                    "facts request failed",
                    extra={"messages": len(said), "reason": type(exc).__name__},
                )
                return None
        run.fact_requests += 1
        run.fact_tokens_in += completion.usage.get("prompt_tokens", 0)
        run.fact_tokens_out += completion.usage.get("completion_tokens", 0)
        found = read_facts(completion.content, len(said))
        if found is None:
            run.facts_unreadable += 1
            logger.warning(
                "facts answer unreadable: the rule's keys instead", extra={"messages": len(said)}
            )
            return _rule_facts(said)
        ordinals: dict[int, int] = {}
        keys: list[FactText] = []
        for index, fact in found:
            ordinal = ordinals[index] = ordinals.get(index, -1) + 1
            keys.append((said[index], ordinal, fact))
        return keys

    async def _failed(self, item: store.DueEmbeddings, run: EmbeddingRun) -> None:
        attempts = item.attempts + 1
        give_up = attempts >= MAX_ATTEMPTS
        retry_in = min(BACKOFF_FIRST_SECONDS * 2 ** (attempts - 1), BACKOFF_MAX_SECONDS)
        await store.embeddings_failed(self.db, item, retry_in=None if give_up else retry_in)
        run.failed += 1
        fields = {"session_id": str(item.session_id), "attempts": attempts}
        if give_up:
            run.gave_up += 1
            logger.error("embeddings given up until the session is queued again", extra=fields)
        else:
            logger.warning(
                "embeddings failed; will retry", extra={**fields, "retry_in_seconds": retry_in}
            )


def _whole(message: store.Unembedded, text: str) -> bool:
    """Whether memory `text` is the whole of `message`, embedded before."""
    return message.embedded and _is_whole(message.text, text)


def _is_whole(message: str, text: str) -> bool:
    """Whether memory `text` is the whole of `message` (its embedding's text)."""
    return text == embedding_text(message).strip()


def remember_stored(conn: psycopg.Connection[Any], model: str, *, batch: int = 500) -> int:
    """Make the durable memories that the live messages and the sessions'
    summaries lack (stored before durable memory, or before what it keeps
    of a message changed; `memchat db reembed --memories`), as the backfill
    would have, as the owner (`conn`): a memory that is its whole message
    takes the message's embedding of `model`, the others are embedded by
    the backfill's next run. Returns how many memories were stored."""
    stored = store.remember_summaries(conn)
    after = 0
    while page := store.live_messages(conn, after=after, limit=batch):
        memories = [
            (m, i, text, _is_whole(m.text, text))
            for m in page
            for i, text in enumerate(memory_sentences(m.text))
        ]
        stored += store.remember_messages(conn, model, memories)
        after = page[-1].id
    return stored


def _memory_texts(request: list[store.Unembedded]) -> list[FactText]:
    """What durable memory keeps of a request's messages (memory_sentences)."""
    return [(m, i, text) for m in request for i, text in enumerate(memory_sentences(m.text))]


def _rule_facts(said: list[store.Unembedded]) -> list[FactText]:
    """The rule's fact keys of `said` (fact_sentences)."""
    return [(m, i, text) for m in said for i, text in enumerate(fact_sentences(m.text))]
