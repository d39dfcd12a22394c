"""The rolling summaries' queue, as the summary worker sees it.

The worker (usecases/summarize.py) logs in as `memchat_worker`, which may
only call the memchat.summary_* functions (supabase/schemas/functions/limits.sql): a
claim leases due queue items, and every later call names its item by that
lease, so the worker can read and write only the sessions the queue hands
it, and only while its lease lives.
"""

from __future__ import annotations

import uuid

from memchat import messages
from memchat.store.db import Database
from memchat.store.fragments import vector_literal
from memchat.store.records import DueSummary, SourceMessage, SummarySource

_CLAIM_DUE = "select memchat.summary_claim(%(limit)s, %(lease)s)"
_SUMMARY_LAG = "select memchat.summary_lag()"
_SUMMARY_SOURCE = "select memchat.summary_source(%s, %s, %s)"
_SAVE_SUMMARY = "select memchat.summary_save(%s, %s, %s, %s)"
_REMEMBER_SUMMARY = "select memchat.summary_remember(%s, %s, %s, %s)"
_SUMMARY_DONE = "select memchat.summary_done(%s, %s)"
_SUMMARY_FAILED = "select memchat.summary_failed(%s, %s)"


async def claim_due_summaries(
    db: Database, *, limit: int, lease_seconds: float
) -> list[DueSummary]:
    """Lease up to `limit` due items for `lease_seconds` (FOR UPDATE SKIP LOCKED
    in one short transaction: another worker skips them; a turn never waits
    longer than this statement)."""
    found = await db.value(None, _CLAIM_DUE, {"limit": limit, "lease": lease_seconds})
    return [
        DueSummary(uuid.UUID(i["lease"]), uuid.UUID(i["session_id"]), int(i["attempts"]))
        for i in found or []
    ]


async def summary_lag(db: Database) -> float | None:
    """Seconds the oldest due item has been waiting (None: none is due)."""
    lag = await db.value(None, _SUMMARY_LAG, ())
    return float(lag) if lag is not None else None


async def summary_failed(db: Database, item: DueSummary, *, retry_in: float | None) -> None:
    """Record a failed refresh: retry after `retry_in` seconds (None: give up
    until the session's next turn queues it again)."""
    await db.value(None, _SUMMARY_FAILED, (item.lease, retry_in))


async def summary_source(
    db: Database, item: DueSummary, *, window: int, chunk: int
) -> SummarySource | None:
    """A leased item's summary so far and up to `chunk` messages after it that
    have left a `window`-message window (None: nothing left to summarize, or
    the lease is gone)."""
    found = await db.value(None, _SUMMARY_SOURCE, (item.lease, window, chunk))
    if not found:
        return None
    return SummarySource(
        lease=item.lease,
        summary=found["summary"],
        covers_until=found["covers_until"],
        messages=[
            SourceMessage(
                m["id"], messages.ROLE_BY_TYPE.get(m["type"], "assistant"), m["content"] or ""
            )
            for m in found["messages"]
        ],
        boundary=int(found["boundary"]),
    )


async def save_summary(db: Database, source: SummarySource, text: str) -> bool:
    """Store `text` as the summary up to `source.boundary`, if the session
    still has the summary it was made from (no clear, no other worker in
    between) and the lease lives. Returns whether it was stored."""
    args = (source.lease, text, source.boundary, source.covers_until)
    return bool(await db.value(None, _SAVE_SUMMARY, args))


async def remember_summary(
    db: Database, item: DueSummary, text: str, model: str, embedding: list[float] | None
) -> bool:
    """Keep `text`, the item's session's summary, as its durable memory (with
    `embedding` of `model`; None: found by words only), replacing the
    session's earlier one; False when the session's summary is no longer
    `text`, its user forgot it, or the lease is gone."""
    args = (item.lease, text, model, vector_literal(embedding))
    return bool(await db.value(None, _REMEMBER_SUMMARY, args))


async def summary_done(db: Database, item: DueSummary, *, due_after: int) -> None:
    """The end of an item's pass: it stays queued while `due_after` or more of
    its session's messages are outside its summary, else leaves the queue."""
    await db.value(None, _SUMMARY_DONE, (item.lease, due_after))
