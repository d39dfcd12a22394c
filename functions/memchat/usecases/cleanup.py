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

Between batches it pauses a multiple of the last batch's duration, and the
multiple adapts to how the batches run (`Pacer`). Deleting a million
messages writes about 440 MB of WAL and keeps a backend busy: every chat
turn's commit must flush the WAL written before it, and on a small database
host the turns and the cleanup share the CPUs. What the cleanup can see of
that without any other privilege or infrastructure is its own batches: a
batch that deletes its rows more slowly than the fastest recent one shared
the machine with someone (resource sharing is mutual: it slowed them about
as much). So each batch's time per deleted row is compared with the lowest
of the last `BASELINE_BATCHES` batches (lock waits, I/O and CPU contention
all show up there):

* at least `SLOW_BATCH` times the baseline: the pause factor doubles,
  up to `MAX_PAUSE_SCALE` times `pause_factor`;
* under `FAST_BATCH` times the baseline (nothing in the way): it shrinks by
  `SPEEDUP`, down to `MIN_PAUSE_SCALE` times `pause_factor`;
* in between it stays.

It starts at `pause_factor` (CLEANUP_PAUSE_FACTOR, default 1); 0 deletes flat
out with no pause at all. A pause never eats into the time the next batch
needs (the budget rule above): when it would, the run stops instead and the
next one resumes. Measured against one client's chat turns
(docs/benchmarks.md, "Scheduled cleanup"): a fixed pause of one batch
duration kept turn p99 at 2.2-2.9x idle; the adaptive pause settles near its
upper bound while turns run and near its lower bound on an idle database.

The Lambda handler and `memchat cleanup [--dry-run] [--max-seconds N]` both
call `run_cleanup`, configured by `settings_from_env`.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
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

# The adaptive pause (see the module docstring and `Pacer`).
# The baseline: the lowest time per deleted row over this many recent batches
# (a sliding window, so that a lucky batch is forgotten and the slow growth of
# a long run's own cost, dead index entries the scan steps over, is followed).
BASELINE_BATCHES = 10
# A batch this many times slower per row than the baseline backs off ...
SLOW_BATCH = 1.2
# ... and one under this many times speeds up (in between: unchanged).
FAST_BATCH = 1.1
BACKOFF = 2.0  # the pause factor's growth on a slow batch
SPEEDUP = 0.8  # and its shrinking on a fast one
# The pause factor's bounds, in multiples of the configured `pause_factor`.
MIN_PAUSE_SCALE = 0.25
MAX_PAUSE_SCALE = 4.0


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
class Pacer:
    """The pause after each batch: `factor` times the batch's duration.

    `factor` starts at `base` and, when `adaptive`, moves within
    [`MIN_PAUSE_SCALE` * base, `MAX_PAUSE_SCALE` * base] with each batch's time
    per deleted row against the lowest of the last `BASELINE_BATCHES`
    (`slowdown`). Not adaptive, or `base` 0: always `base`. Pure arithmetic on
    what it is told, so that tests can drive it with any durations.
    """

    base: float
    adaptive: bool = True
    factor: float = field(init=False)
    slowdown: float = field(init=False, default=1.0)  # the last batch's
    _costs: deque[float] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.base < 0:
            raise ValueError("pause factor must be >= 0")
        self.factor = self.base
        self._costs = deque(maxlen=BASELINE_BATCHES)

    @property
    def bounds(self) -> tuple[float, float]:
        if not self.adaptive:
            return self.base, self.base
        return self.base * MIN_PAUSE_SCALE, self.base * MAX_PAUSE_SCALE

    def after_batch(self, seconds: float, rows: int) -> float:
        """The pause (s) after a batch that deleted `rows` rows in `seconds`."""
        if not self.adaptive or self.base == 0:
            return self.base * seconds
        cost = seconds / max(rows, 1)
        if cost > 0:  # a batch too short for the clock tells nothing
            self._costs.append(cost)
        baseline = min(self._costs, default=0.0)
        self.slowdown = cost / baseline if cost > 0 and baseline > 0 else 1.0
        low, high = self.bounds
        if self.slowdown >= SLOW_BATCH:
            self.factor = min(self.factor * BACKOFF, high)
        elif self.slowdown < FAST_BATCH:
            self.factor = max(self.factor * SPEEDUP, low)
        return self.factor * seconds


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
    adaptive: bool = True,
) -> CleanupResult:
    """Delete expired sessions (and their messages) until done or out of time.

    `remaining_ms` is the Lambda context's `get_remaining_time_in_millis`;
    `max_seconds` caps the run from the CLI. With neither, it runs until done.
    `dry_run` only counts what would be deleted. `pause_factor` throttles
    (see the module docstring); 0 deletes flat out. `adaptive=False` keeps
    the pause at exactly `pause_factor` batch durations (the behaviour before
    the adaptive pause, kept for comparison). Batches are timed with `clock`,
    pauses taken with `sleep`: tests inject both.
    """
    if batch_size < 1:
        raise ValueError("batch_size must be >= 1")
    pacer = Pacer(pause_factor, adaptive=adaptive)
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
            left = seconds_left()
            while left > SLOWEST_BATCH_FACTOR * slowest:
                began = clock()
                try:
                    got_sessions, got_messages = store.expire_sessions_batch(conn, batch_size)
                except (pg_errors.TransactionRollback, pg_errors.LockNotAvailable) as exc:
                    # A deadlock with an account deletion, say: the batch rolled
                    # back; the next run retries it.
                    logger.warning("cleanup batch rolled back (%s): stopping", exc.sqlstate)
                    break
                took = clock() - began
                slowest = max(slowest, took)
                batches += 1
                sessions += got_sessions
                messages += got_messages
                if got_sessions < batch_size:
                    finished = True
                    break
                pause = pacer.after_batch(took, got_sessions + got_messages)
                logger.debug(
                    "cleanup batch %d: %d rows in %.3f s, slowdown %.2f, pause %.3f s",
                    batches,
                    got_sessions + got_messages,
                    took,
                    pacer.slowdown,
                    pause,
                )
                left = seconds_left()
                if pause > 0:
                    if left - pause <= SLOWEST_BATCH_FACTOR * slowest:
                        break  # no time for another batch after it: the next run goes on
                    sleep(pause)
                    left = seconds_left()
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
