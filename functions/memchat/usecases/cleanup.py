"""Scheduled cleanup: delete expired sessions with their messages.

Sessions expire `SESSION_TTL_HOURS` after their last turn (every turn slides
`expires_at`). `run_cleanup` deletes the expired ones in batches of
`batch_size`, each batch its own short transaction (`store.expire_sessions_batch`:
FOR UPDATE SKIP LOCKED, so a session a turn is extending right now is neither
waited for nor deleted). Active-session pointers to deleted sessions go with
them (FK cascade); long-term notes stay.

It stops when a batch comes back short (nothing left: `finished=True`) or
before starting a batch it may not have time to finish: when the time left
(`max_seconds` from the start, or the Lambda context's remaining time less
`LAMBDA_RESERVE_SECONDS` to return in) is below three times the slowest batch
so far. The next run resumes where this one stopped; two runs at once share the work.

Between batches it pauses `pause_factor` times the last batch's duration
(default 1: deleting at most half of the time). Deleting a million messages
writes about 440 MB of WAL, and every chat turn's commit must flush the WAL
written before it; unthrottled, turn p99 rose about 3.8x during a cleanup,
throttled it stays under 2x (docs/benchmarks.md).

The Lambda handler and `memchat cleanup [--dry-run] [--max-seconds N]` both
call `run_cleanup`, configured by `settings_from_env`.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import errors as pg_errors

from memchat import store
from memchat.config import ConfigError
from memchat.db import connect_kwargs

logger = logging.getLogger(__name__)

# Time a Lambda keeps back to close the connection, log and return.
LAMBDA_RESERVE_SECONDS = 2.0
# Stop when the time left is below this many times the slowest batch so far.
SLOWEST_BATCH_FACTOR = 3.0
APPLICATION_NAME = "memchat-cleanup"


def settings_from_env(environ: Mapping[str, str] | None = None) -> tuple[int, float]:
    """(CLEANUP_BATCH_SIZE, CLEANUP_PAUSE_FACTOR), validated; ConfigError names the bad one."""
    env = os.environ if environ is None else environ
    raw_batch = env.get("CLEANUP_BATCH_SIZE", "1000").strip()
    if not raw_batch.isdigit() or not 1 <= int(raw_batch) <= 100_000:
        raise ConfigError("invalid configuration: CLEANUP_BATCH_SIZE must be 1..100000")
    try:
        pause = float(env.get("CLEANUP_PAUSE_FACTOR", "1").strip())
    except ValueError:
        pause = -1.0
    if not 0 <= pause <= 100:
        raise ConfigError("invalid configuration: CLEANUP_PAUSE_FACTOR must be 0..100")
    return int(raw_batch), pause


@dataclass
class CleanupResult:
    deleted_sessions: int
    deleted_messages: int
    batches: int
    duration_ms: float
    finished: bool  # nothing expired is left (False: stopped by the time budget)
    dry_run: bool = False  # counts are what a run would delete; nothing was

    def as_dict(self) -> dict[str, Any]:
        """The logged and returned contract (plus `dry_run` when true)."""
        out: dict[str, Any] = {
            "deleted_sessions": self.deleted_sessions,
            "deleted_messages": self.deleted_messages,
            "batches": self.batches,
            "duration_ms": round(self.duration_ms, 1),
            "finished": self.finished,
        }
        if self.dry_run:
            out["dry_run"] = True
        return out


def run_cleanup(
    conninfo: str,
    *,
    batch_size: int,
    max_seconds: float | None = None,
    dry_run: bool = False,
    remaining_ms: Callable[[], int] | None = None,
    clock: Callable[[], float] = time.monotonic,
    pause_factor: float = 1.0,
    sleep: Callable[[float], None] = time.sleep,
) -> CleanupResult:
    """Delete expired sessions (and their messages) until done or out of time.

    `remaining_ms` is the Lambda context's `get_remaining_time_in_millis`;
    `max_seconds` caps the run from the CLI. With neither, it runs until done.
    `dry_run` only counts what would be deleted. `pause_factor` throttles
    (see the module docstring); 0 deletes flat out.
    """
    if batch_size < 1:
        raise ValueError("batch_size must be >= 1")
    start = clock()

    def seconds_left() -> float:
        left = float("inf")
        if max_seconds is not None:
            left = max_seconds - (clock() - start)
        if remaining_ms is not None:
            left = min(left, remaining_ms() / 1000 - LAMBDA_RESERVE_SECONDS)
        return left

    sessions = messages = batches = 0
    finished = False
    with psycopg.connect(conninfo, application_name=APPLICATION_NAME, **connect_kwargs()) as conn:
        if dry_run:
            sessions, messages = store.count_expired(conn)
            finished = True
        else:
            store.purge_expired_claims(conn)
            slowest = 0.0
            while seconds_left() > SLOWEST_BATCH_FACTOR * slowest:
                began = clock()
                took = time.perf_counter()
                try:
                    got_sessions, got_messages = store.expire_sessions_batch(conn, batch_size)
                except (pg_errors.TransactionRollback, pg_errors.LockNotAvailable) as exc:
                    # A deadlock with an account deletion, say: the batch rolled
                    # back; the next run retries it.
                    logger.warning("cleanup batch rolled back (%s): stopping", exc.sqlstate)
                    break
                slowest = max(slowest, clock() - began)
                batches += 1
                sessions += got_sessions
                messages += got_messages
                if got_sessions < batch_size:
                    finished = True
                    break
                if pause_factor:
                    sleep((time.perf_counter() - took) * pause_factor)
    result = CleanupResult(
        deleted_sessions=sessions,
        deleted_messages=messages,
        batches=batches,
        duration_ms=(clock() - start) * 1000,
        finished=finished,
        dry_run=dry_run,
    )
    logger.info("cleanup %s", json.dumps(result.as_dict()), extra={"cleanup": result.as_dict()})
    return result
