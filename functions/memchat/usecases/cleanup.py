"""Scheduled cleanup: delete expired sessions with their messages.

Sessions expire `SESSION_TTL_HOURS` after their last turn (every turn slides
`expires_at`). `Cleanup.run` deletes the expired ones in batches of
`batch_size`, each batch its own short transaction (`store.expire_sessions_batch`:
FOR UPDATE SKIP LOCKED, so a session a turn is extending right now is neither
waited for nor deleted). Active-session pointers to deleted sessions go with
them (FK cascade); long-term notes stay, and so do the sessions' memories
(memchat.memories), `memory_retention_days` (MEMORY_RETENTION_DAYS) past each
session's expiry. Once no expired session is left, the memories past their
retention are deleted, in batches of `batch_size`.

It stops when a batch comes back short (nothing left: `finished=True`) or
before starting a batch it may not have time to finish (`TimeBudget`): when
the time left (`max_seconds` from the start, or the Lambda context's
remaining time less `LAMBDA_RESERVE_SECONDS` to return in) is below three
times the slowest batch so far. The next run resumes where this one stopped;
two runs at once share the work.

Between batches it pauses a multiple of the last batch's duration, and the
multiple (the pause factor) adapts (`Pacer`). Deleting a million messages
writes about 440 MB of WAL and keeps a backend busy: every chat turn's
commit must flush the WAL written before it, and on a small database host
the turns and the cleanup share the CPUs, so turns that overlap a batch are
slower. The cleanup measures, with nothing beyond its own login:

* **whether anyone is using the database**: other transactions that wrote
  (took a transaction id) and finished: the current snapshot's xmax, one
  past the latest to finish (`pg_current_snapshot()`), moved by more than
  the batch's own one. A chat turn writes; none for `IDLE_SECONDS`: idle;
* **what a batch does to a turn's latency** (`LatencyProbe`): a second
  connection times a trivial query every `PROBE_INTERVAL` seconds. Those
  answered while a batch ran against those answered while it paused (the
  last `PROBE_REFERENCE`) say how much the batch slows a client right now;
  compared within moments, steady load, the network and the host cancel
  out (the `harm`, smoothed over batches);
* **its batches' own speed**: time per deleted row against the lowest of
  the last `BASELINE_BATCHES` batches. A lock wait (a cascade waiting for a
  row a turn holds) or a host busy with something else shows up there.

After each batch the factor grows by `BACKOFF` (up to `MAX_PAUSE_SCALE`
times `pause_factor`) when the batch ran `SLOW_BATCH` times slower than its
baseline, or when others wrote and the harm is `HARM_SLOW` or more (or
unknown: no probe); it shrinks by `SPEEDUP` (down to `MIN_PAUSE_SCALE` times
`pause_factor`) when the batch ran under `FAST_BATCH` times its baseline and
either the database is idle or the harm is under `HARM_FAST`; otherwise it
stays. It starts at `pause_factor` (CLEANUP_PAUSE_FACTOR, default 1); 0
deletes flat out with no pause and no probe. A pause never eats into the
time the next batch needs (the budget rule above): when it would, the run
stops instead and the next one resumes. Measured against one client's chat
turns in docs/benchmarks.md, "Scheduled cleanup".

The Lambda handler and `memchat cleanup [--dry-run] [--max-seconds N]` both
build theirs with `memchat.bootstrap.cleanup` (DATABASE_URL,
CLEANUP_BATCH_SIZE, CLEANUP_PAUSE_FACTOR: the one settings object,
memchat.config).

Example:
    cleanup = bootstrap.cleanup(settings)
    result = cleanup.run(TimeBudget(max_seconds=60))  # or cleanup.dry_run()
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import errors as pg_errors
from psycopg.conninfo import make_conninfo

from memchat import store

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.typing import LambdaContext


logger = logging.getLogger(__name__)

# Time a Lambda keeps back to close the connection, log and return.
LAMBDA_RESERVE_SECONDS = 2.0
# Stop when the time left is below this many times the slowest batch so far.
SLOWEST_BATCH_FACTOR = 3.0
APPLICATION_NAME = "memchat-cleanup"
PROBE_APPLICATION_NAME = "memchat-cleanup-probe"

# The adaptive pause (see the module docstring and `Pacer`).
# No other transaction wrote for this long (s): the database is idle.
IDLE_SECONDS = 10.0
# The latency probe: one trivial query this often (s) on its own connection ...
PROBE_INTERVAL = 0.02
# (at the end, waiting this long (s) at most for its last round trip) ...
PROBE_JOIN_SECONDS = 5.0
# ... the reference: the last this many probes answered during pauses ...
PROBE_REFERENCE = 50
# ... and the harm: a batch's probes' mean latency over the reference's mean,
# smoothed over batches (each new batch weighs 1 - HARM_SMOOTHING: one probe
# held up by something else must not decide).
HARM_SMOOTHING = 0.5
HARM_SLOW = 1.5  # at or above (with others writing): back off
HARM_FAST = 1.2  # under: may speed up
# A batch's speed: its time per deleted row over the lowest of this many
# recent batches (a sliding window, so that a lucky batch is forgotten and the
# slow growth of a long run's own cost, dead index entries the scan steps
# over, is followed). At or above SLOW_BATCH: back off; under FAST_BATCH: may
# speed up.
BASELINE_BATCHES = 10
SLOW_BATCH = 1.2
FAST_BATCH = 1.1
BACKOFF = 1.5  # the pause factor's growth
SPEEDUP = 0.8  # and its shrinking
# The pause factor's bounds, in multiples of the configured `pause_factor`.
MIN_PAUSE_SCALE = 0.25
MAX_PAUSE_SCALE = 4.0


@dataclass
class Pacer:
    """The pause after each batch: `factor` times the batch's duration.

    `factor` starts at `base` and, when `adaptive`, moves within
    [`MIN_PAUSE_SCALE` * base, `MAX_PAUSE_SCALE` * base] by the rule in the
    module docstring. Not adaptive, or `base` 0: always `base`. Pure
    arithmetic on what it is told, so that tests can drive it with any numbers.
    """

    base: float
    adaptive: bool = True
    factor: float = field(init=False)
    # What the batches showed so far (for the debug log and tests):
    slowdown: float = field(init=False, default=1.0)  # the last batch's
    harm: float | None = field(init=False, default=None)  # smoothed; None: never probed
    active: bool = field(init=False, default=False)  # others wrote lately
    _last_write: float | None = field(init=False, default=None, repr=False)
    _costs: deque[float] = field(init=False, repr=False)
    _reference: deque[float] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.base < 0:
            raise ValueError("pause factor must be >= 0")
        self.factor = self.base
        self._costs = deque(maxlen=BASELINE_BATCHES)
        self._reference = deque(maxlen=PROBE_REFERENCE)

    @property
    def bounds(self) -> tuple[float, float]:
        if not self.adaptive:
            return self.base, self.base
        return self.base * MIN_PAUSE_SCALE, self.base * MAX_PAUSE_SCALE

    def after_batch(
        self,
        seconds: float,
        rows: int,
        *,
        at: float = 0.0,
        writes: int = 0,
        probes_during: Sequence[float] = (),
        probes_before: Sequence[float] = (),
    ) -> float:
        """The pause (s) after a batch that deleted `rows` rows in `seconds`.

        `at`: when the batch ended (the run's clock); `writes`: how many other
        transactions wrote since the previous batch ended; `probes_during`:
        the probe's latencies answered while the batch ran, `probes_before`:
        those answered before it since the previous batch (its pause).
        """
        if not self.adaptive or self.base == 0:
            return self.base * seconds
        cost = seconds / max(rows, 1)
        if cost > 0:  # a batch too short for the clock tells nothing
            self._costs.append(cost)
        baseline = min(self._costs, default=0.0)
        self.slowdown = cost / baseline if cost > 0 and baseline > 0 else 1.0
        if writes > 0:
            self._last_write = at
        self.active = self._last_write is not None and at - self._last_write < IDLE_SECONDS
        self._reference.extend(probes_before)
        reference = sum(self._reference) / len(self._reference) if self._reference else 0.0
        if probes_during and reference > 0:  # else (a batch too short): the harm so far
            harm = sum(probes_during) / len(probes_during) / reference
            if self.harm is not None:
                harm = HARM_SMOOTHING * self.harm + (1 - HARM_SMOOTHING) * harm
            self.harm = harm
        hurts = self.active and (self.harm is None or self.harm >= HARM_SLOW)
        harmless = not self.active or (self.harm is not None and self.harm < HARM_FAST)
        low, high = self.bounds
        if self.slowdown >= SLOW_BATCH or hurts:
            self.factor = min(self.factor * BACKOFF, high)
        elif self.slowdown < FAST_BATCH and harmless:
            self.factor = max(self.factor * SPEEDUP, low)
        return self.factor * seconds


class LatencyProbe:
    """Times a trivial query on its own connection every `interval` s, in a thread.

    What a user's turn would feel at that moment, in miniature: a round trip
    to the same database through the same pooler. `take()` hands over the
    latencies (ms) answered since the last call. If the connection cannot be
    made or fails, it stops quietly (logged) and `take()` returns nothing: the
    cleanup goes on without it.
    """

    def __init__(self, conninfo: str, interval: float = PROBE_INTERVAL) -> None:
        self._conninfo = conninfo
        self._interval = interval
        self._samples: list[float] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._conn: psycopg.Connection[Any] | None = None

    def __enter__(self) -> LatencyProbe:
        try:
            self._conn = store.connect(
                make_conninfo(self._conninfo, application_name=PROBE_APPLICATION_NAME)
            )
        except psycopg.Error as exc:
            logger.warning("cleanup latency probe unavailable (%s): pacing by batches", exc)
            return self
        self._thread = threading.Thread(target=self._run, name="cleanup-probe", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(PROBE_JOIN_SECONDS)
            if self._thread.is_alive():  # a round trip hung: leave it to the process
                logger.warning("cleanup latency probe did not stop; its connection is left")
                return
        if self._conn is not None:
            self._conn.close()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def take(self) -> list[float]:
        with self._lock:
            samples, self._samples = self._samples, []
        return samples

    def _run(self) -> None:
        assert self._conn is not None
        try:
            while not self._stop.wait(self._interval):
                began = time.perf_counter()
                store.probe(self._conn)
                took = (time.perf_counter() - began) * 1000
                with self._lock:
                    self._samples.append(took)
        except psycopg.Error as exc:
            logger.warning("cleanup latency probe stopped (%s): pacing by batches", exc)


@dataclass(frozen=True)
class TimeBudget:
    """The time a run has: `max_seconds` from its start (`memchat cleanup
    --max-seconds`), and what a Lambda invocation has left (`remaining_ms`,
    its context's `get_remaining_time_in_millis`) less `reserve_seconds` to
    return in. Neither: no limit, the run goes on until nothing is left."""

    max_seconds: float | None = None
    remaining_ms: Callable[[], int] | None = None
    reserve_seconds: float = LAMBDA_RESERVE_SECONDS

    @classmethod
    def of_lambda(cls, context: LambdaContext) -> TimeBudget:
        return cls(remaining_ms=context.get_remaining_time_in_millis)

    def seconds_left(self, elapsed: Callable[[], float]) -> float:
        """The time left once the run has taken `elapsed()` seconds (asked only
        when `max_seconds` counts: a test's clock sees each read)."""
        left = math.inf
        if self.max_seconds is not None:
            left = self.max_seconds - elapsed()
        if self.remaining_ms is not None:
            left = min(left, self.remaining_ms() / 1000 - self.reserve_seconds)
        return left

    def room_for_batch(
        self, slowest: float, elapsed: Callable[[], float], *, after_pause: float = 0.0
    ) -> bool:
        """Whether another batch may start, after a pause of `after_pause` s:
        whether the time left then is more than SLOWEST_BATCH_FACTOR times the
        slowest batch so far (`slowest`), so that it can finish in time."""
        return self.seconds_left(elapsed) - after_pause > SLOWEST_BATCH_FACTOR * slowest


NO_LIMIT = TimeBudget()


@dataclass
class CleanupResult:
    deleted_sessions: int
    deleted_messages: int
    batches: int
    duration_ms: float
    finished: bool  # nothing expired is left (False: stopped by the time budget)
    dry_run: bool = False  # counts are what a run would delete; nothing was
    deleted_memories: int = 0  # past their retention

    def as_dict(self) -> dict[str, Any]:
        """The logged and returned contract (plus `dry_run` when true)."""
        out: dict[str, Any] = {
            "deleted_sessions": self.deleted_sessions,
            "deleted_messages": self.deleted_messages,
            "deleted_memories": self.deleted_memories,
            "batches": self.batches,
            "duration_ms": round(self.duration_ms, 1),
            "finished": self.finished,
        }
        if self.dry_run:
            out["dry_run"] = True
        return out


@dataclass(frozen=True)
class Batch:
    """What one batch deleted, when it began and how long it took (the run's clock)."""

    sessions: int
    messages: int
    began: float
    seconds: float

    @property
    def rows(self) -> int:
        return self.sessions + self.messages


@dataclass(frozen=True)
class Cleanup:
    """Deletes expired sessions (and their messages) until none is left or
    its time is up; see the module docstring.

    `pause_factor` throttles; 0 deletes flat out. `adaptive=False` keeps the
    pause at exactly `pause_factor` batch durations (the pause before it
    adapted, kept for comparison). `probe=False` paces without the latency
    probe's connection and thread (by the batches' speed and others' writes:
    any writes back off). Batches are timed with `clock`, pauses taken with
    `sleep`: tests inject both (the probe times real round trips with its own
    clock).
    """

    conninfo: str
    batch_size: int
    pause_factor: float
    # The deleted sessions' memories are kept this many days past each one's expiry.
    memory_retention_days: int = 365
    adaptive: bool = True
    probe: bool = True
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        if self.pause_factor < 0:
            raise ValueError("pause factor must be >= 0")

    def run(self, budget: TimeBudget = NO_LIMIT) -> CleanupResult:
        """Delete expired sessions until none is left, a batch rolls back, or
        `budget` has no room for another batch; logged as one line."""
        started = self.clock()
        with self._connect() as conn, _latency_probe(self.conninfo, self._probing) as latency:
            self.purge(conn)
            pacing = _Pacing(
                Pacer(self.pause_factor, adaptive=self.adaptive), latency, conn, self._pacing
            )
            tally = self._batches(conn, pacing, budget, started)
            if tally.finished:
                tally.memories = self._expire_memories(conn, budget, started)
        return self._result(tally, started)

    def dry_run(self) -> CleanupResult:
        """What a run would delete now, counted (as `deleted_*`); nothing is deleted."""
        started = self.clock()
        with self._connect() as conn:
            sessions, messages = store.count_expired(conn)
        return self._result(_Tally(sessions, messages, finished=True), started, dry_run=True)

    def purge(self, conn: psycopg.Connection[Any]) -> None:
        """Delete what crashed turns and idle throttles leave behind (expired
        turn claims, rate buckets untouched for a day)."""
        store.purge_expired_claims(conn)
        store.purge_idle_rate_buckets(conn)

    def batch(self, conn: psycopg.Connection[Any]) -> Batch | None:
        """One batch, its own transaction; None if it rolled back (a deadlock
        with an account deletion, say): the next run retries it."""
        began = self.clock()
        try:
            sessions, messages = store.expire_sessions_batch(
                conn, self.batch_size, self.memory_retention_days
            )
        except (pg_errors.TransactionRollback, pg_errors.LockNotAvailable) as exc:
            logger.warning("cleanup batch rolled back (%s): stopping", exc.sqlstate)
            return None
        return Batch(sessions, messages, began, self.clock() - began)

    def _expire_memories(
        self, conn: psycopg.Connection[Any], budget: TimeBudget, started: float
    ) -> int:
        """Delete the memories past their retention, a batch at a time (each
        a few index reads and deletes, far lighter than a session's batch),
        while the budget has room; returns how many went."""
        deleted = 0
        slowest = 0.0

        def elapsed() -> float:
            return self.clock() - started

        while budget.room_for_batch(slowest, elapsed):
            began = self.clock()
            try:
                gone = store.expire_memories_batch(conn, self.batch_size)
            except (pg_errors.TransactionRollback, pg_errors.LockNotAvailable) as exc:
                logger.warning("memory cleanup batch rolled back (%s): stopping", exc.sqlstate)
                break
            slowest = max(slowest, self.clock() - began)
            deleted += gone
            if gone < self.batch_size:
                break
        return deleted

    def _pause_after(self, batch: Batch, number: int, pacing: _Pacing) -> float:
        """The adaptive pause (s) after a full batch, the `number`th (`Pacer`)."""
        during = pacing.latency.take()
        writes = pacing.others_writes()
        pacer = pacing.pacer
        pause = pacer.after_batch(
            batch.seconds,
            batch.rows,
            at=batch.began + batch.seconds,
            writes=writes,
            probes_during=during,
            probes_before=pacing.before,
        )
        logger.debug(
            "cleanup batch %d: %d rows in %.3f s, slowdown %.2f, harm %s,"
            " %d other writes, %s: pause %.3f s",
            number,
            batch.rows,
            batch.seconds,
            pacer.slowdown,
            "-" if pacer.harm is None else f"{pacer.harm:.2f}",
            writes,
            "-" if not pacing.counts_writes else "in use" if pacer.active else "idle",
            pause,
        )
        return pause

    @property
    def _pacing(self) -> bool:
        return self.adaptive and self.pause_factor > 0

    @property
    def _probing(self) -> bool:
        return self._pacing and self.probe

    def _connect(self) -> psycopg.Connection[Any]:
        return store.connect(make_conninfo(self.conninfo, application_name=APPLICATION_NAME))

    def _batches(
        self, conn: psycopg.Connection[Any], pacing: _Pacing, budget: TimeBudget, started: float
    ) -> _Tally:
        def elapsed() -> float:
            return self.clock() - started

        tally = _Tally()
        slowest = 0.0
        while budget.room_for_batch(slowest, elapsed):
            pacing.before = pacing.latency.take()  # answered during the pause (or the start)
            batch = self.batch(conn)
            if batch is None:
                break
            slowest = max(slowest, batch.seconds)
            tally.add(batch)
            if batch.sessions < self.batch_size:
                tally.finished = True
                break
            pause = self._pause_after(batch, tally.batches, pacing)
            if pause > 0:
                if not budget.room_for_batch(slowest, elapsed, after_pause=pause):
                    break  # no time for another batch after it: the next run goes on
                self.sleep(pause)
        return tally

    def _result(self, tally: _Tally, started: float, *, dry_run: bool = False) -> CleanupResult:
        result = CleanupResult(
            deleted_sessions=tally.sessions,
            deleted_messages=tally.messages,
            batches=tally.batches,
            deleted_memories=tally.memories,
            duration_ms=(self.clock() - started) * 1000,
            finished=tally.finished,
            dry_run=dry_run,
        )
        logger.info("cleanup %s", json.dumps(result.as_dict()), extra={"cleanup": result.as_dict()})
        return result


@dataclass
class _Tally:
    sessions: int = 0
    messages: int = 0
    batches: int = 0
    finished: bool = False
    memories: int = 0

    def add(self, batch: Batch) -> None:
        self.batches += 1
        self.sessions += batch.sessions
        self.messages += batch.messages


class _NoProbe:
    def take(self) -> list[float]:
        return []


@dataclass
class _Pacing:
    """What one run's adaptive pause is fed besides the batches: the probe's
    round trips, before and during each batch, and others' writes."""

    pacer: Pacer
    latency: LatencyProbe | _NoProbe
    conn: psycopg.Connection[Any]
    counts_writes: bool  # pacing adaptively: worth a round trip per batch
    before: list[float] = field(default_factory=list)  # answered before the batch
    _last_xid: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        if self.counts_writes:
            self._last_xid = store.next_xid(self.conn)

    def others_writes(self) -> int:
        """Transactions others wrote and finished since the last call."""
        if not self.counts_writes:
            return 0
        previous, self._last_xid = self._last_xid, store.next_xid(self.conn)
        return max(0, self._last_xid - previous - 1)  # less the batch's own


@contextmanager
def _latency_probe(conninfo: str, enabled: bool) -> Iterator[LatencyProbe | _NoProbe]:
    if not enabled:
        yield _NoProbe()
        return
    with LatencyProbe(conninfo) as probe:
        yield probe
