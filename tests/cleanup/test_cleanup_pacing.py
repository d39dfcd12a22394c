"""The cleanup's adaptive pause: longer while batches run slow, shorter while they run fast.

`run_cleanup` measures each batch with its `clock` and pauses with its
`sleep`; the tests below inject both (a clock that moves a fixed tick per
read, so that every batch "takes" the same time and its speed per row is
set by how many rows it deletes), and run against the real database: the
rows each batch deletes are the real ones. One test uses the real clock and a
real lock wait. `Pacer` itself is plain arithmetic, tested directly last.
"""

from __future__ import annotations

import threading
import uuid
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from memchat.usecases import cleanup
from memchat.usecases.cleanup import Pacer, run_cleanup
from tests.cleanup.conftest import Seeder

# Expired before anything the other tests create: these go first, in this order.
EPOCH = datetime(1960, 1, 1, tzinfo=UTC)
TICK = 0.5  # seconds per clock read: every batch takes exactly TICK


class FakeTime:
    """A clock that moves `tick` seconds per read, and a sleep that records and moves it."""

    def __init__(self, tick: float = TICK) -> None:
        self.now = 0.0
        self.tick = tick
        self.pauses: list[float] = []

    def clock(self) -> float:
        self.now += self.tick
        return self.now

    def sleep(self, seconds: float) -> None:
        self.pauses.append(seconds)
        self.now += seconds


def _oldest_first(seed: Seeder, user_id: uuid.UUID, messages: list[int]) -> list[uuid.UUID]:
    """Expired sessions with these message counts, deleted in this order."""
    return [
        seed.session(user_id, expires_at=EPOCH + timedelta(minutes=i), messages=n)
        for i, n in enumerate(messages)
    ]


def test_the_law_these_tests_assume():
    assert (cleanup.SLOW_BATCH, cleanup.FAST_BATCH) == (1.2, 1.1)
    assert (cleanup.BACKOFF, cleanup.SPEEDUP) == (2.0, 0.8)
    assert (cleanup.MIN_PAUSE_SCALE, cleanup.MAX_PAUSE_SCALE) == (0.25, 4.0)
    assert cleanup.BASELINE_BATCHES == 10


def test_pause_lengthens_while_batches_slow_down_and_shortens_after(
    cleanup_url, users, seed: Seeder
):
    user = users.create()
    # One session per batch, each batch TICK long: its time per row is set by
    # its size. 10 rows (a session and 9 messages) is the fast pace; 9 rows is
    # 1.11x slower per row (inside the band: no change); 4 rows is 2.5x slower.
    fast, bit_slower, slow = 9, 8, 3
    plan = [fast] * 3 + [bit_slower] + [slow] * 5 + [fast] * 13
    mine = _oldest_first(seed, user.user_id, plan)
    time = FakeTime()

    result = run_cleanup(
        cleanup_url, batch_size=1, pause_factor=1.0, clock=time.clock, sleep=time.sleep
    )

    assert result.finished and not any(seed.exists(sid) for sid in mine)
    factors = [p / TICK for p in time.pauses[: len(plan)]]
    expected = [
        *[0.8, 0.64, 0.512],  # nothing in the way: eases off from the configured 1
        0.512,  # 1.11x slower per row: holds
        *[1.024, 2.048, 4.0, 4.0, 4.0],  # 2.5x slower: doubles, up to 4x the setting
        # back to the fast pace: shrinks again, down to a quarter of the setting
        *[3.2, 2.56, 2.048, 1.6384, 1.31072, 1.048576, 0.8388608, 0.67108864],
        *[0.536870912, 0.4294967296, 0.34359738368, 0.274877906944, 0.25],
    ]
    assert factors == pytest.approx(expected)


def test_bounds_follow_the_configured_factor(cleanup_url, users, seed: Seeder):
    user = users.create()
    mine = _oldest_first(seed, user.user_id, [9] + [3] * 4)
    time = FakeTime()

    run_cleanup(cleanup_url, batch_size=1, pause_factor=0.5, clock=time.clock, sleep=time.sleep)

    assert not any(seed.exists(sid) for sid in mine)
    factors = [p / TICK for p in time.pauses[:5]]
    # Starts at 0.5, eases to 0.4, then doubles up to 4 x 0.5 = 2.
    assert factors == pytest.approx([0.4, 0.8, 1.6, 2.0, 2.0])


def test_a_fixed_factor_or_none_does_not_adapt(cleanup_url, users, seed: Seeder):
    user = users.create()
    plan = [9, 3, 3, 9]
    mine = _oldest_first(seed, user.user_id, plan)
    time = FakeTime()
    run_cleanup(
        cleanup_url,
        batch_size=1,
        pause_factor=1.5,
        adaptive=False,
        clock=time.clock,
        sleep=time.sleep,
    )
    assert not any(seed.exists(sid) for sid in mine)
    assert time.pauses[: len(plan)] == pytest.approx([1.5 * TICK] * len(plan))

    mine = _oldest_first(seed, user.user_id, plan)
    flat_out = FakeTime()
    result = run_cleanup(
        cleanup_url, batch_size=1, pause_factor=0, clock=flat_out.clock, sleep=flat_out.sleep
    )
    assert result.finished and not any(seed.exists(sid) for sid in mine)
    assert flat_out.pauses == []


def test_a_pause_never_eats_into_the_next_batchs_time(cleanup_url, users, seed: Seeder):
    user = users.create()
    mine = _oldest_first(seed, user.user_id, [2, 2, 2])
    time = FakeTime(tick=1.0)

    # The first batch takes 1 s and earns a pause of 80 s (factor 100, eased to
    # 80); with 60 s in all, that would leave less than 3x the batch for the
    # next: the run stops without sleeping and the next run goes on.
    first = run_cleanup(
        cleanup_url,
        batch_size=1,
        max_seconds=60,
        pause_factor=100,
        clock=time.clock,
        sleep=time.sleep,
    )
    assert (first.batches, first.deleted_sessions, first.finished) == (1, 1, False)
    assert time.pauses == []
    assert [seed.exists(sid) for sid in mine] == [False, True, True]

    # With room for both, it sleeps and goes on.
    ample = FakeTime(tick=1.0)
    second = run_cleanup(
        cleanup_url,
        batch_size=1,
        max_seconds=1000,
        pause_factor=100,
        clock=ample.clock,
        sleep=ample.sleep,
    )
    assert second.finished and not any(seed.exists(sid) for sid in mine)
    assert ample.pauses[0] == pytest.approx(80.0)


def test_a_batch_held_up_by_a_lock_lengthens_the_pause(admin_url, cleanup_url, users, seed: Seeder):
    """Real time: a turn holds the active-session pointer the cascade must delete."""
    user = users.create()
    before, held, after = _oldest_first(seed, user.user_id, [2, 2, 2])
    seed.admin.execute(
        "insert into public.user_agent_active_sessions (user_id, agent_name,"
        " active_session_id) values (%s, 'held', %s)",
        (user.user_id, held),
    )
    locked = threading.Event()
    hold_seconds = 1.0

    def hold_the_pointer() -> None:
        with psycopg.connect(admin_url) as turn, turn.transaction():
            turn.execute(
                "select 1 from public.user_agent_active_sessions"
                " where active_session_id = %s for update",
                (held,),
            )
            locked.set()
            turn.execute("select pg_sleep(%s)", (hold_seconds,))

    holder = threading.Thread(target=hold_the_pointer)
    holder.start()
    try:
        assert locked.wait(10)
        pauses: list[float] = []
        result = run_cleanup(cleanup_url, batch_size=1, sleep=pauses.append)
    finally:
        holder.join()

    assert result.finished
    assert not any(seed.exists(sid) for sid in (before, held, after))
    # The first batch (a few ms) eases the factor to 0.8; the second waits
    # most of a second for the lock, far slower per row than the first: the
    # factor doubles to 1.6, and the pause is 1.6x that long batch.
    assert pauses[0] < 0.8 * 0.5
    assert pauses[1] >= 1.6 * 0.5 * hold_seconds


# ------------------------------------------------------------- Pacer alone


def test_pacer_forgets_a_lucky_batch_after_the_baseline_window():
    pacer = Pacer(1.0)
    pacer.after_batch(0.5, 1000)  # unusually fast: 0.5 ms per row
    factors = []
    for _ in range(cleanup.BASELINE_BATCHES + 2):
        pacer.after_batch(1.0, 1000)  # 1 ms per row: 2x the lucky one
        factors.append(pacer.factor)
    # Slow against the lucky batch while it is in the window (9 more batches),
    # at the baseline once it has left it.
    assert factors[: cleanup.BASELINE_BATCHES - 1] == pytest.approx(
        [1.6, 3.2, 4.0, 4.0, 4.0, 4.0, 4.0, 4.0, 4.0]
    )
    assert factors[cleanup.BASELINE_BATCHES - 1 :] == pytest.approx([3.2, 2.56, 2.048])


def test_pacer_pause_is_the_factor_times_the_batch():
    pacer = Pacer(2.0)
    assert pacer.after_batch(0.3, 100) == pytest.approx(1.6 * 0.3)
    assert pacer.slowdown == 1.0
    assert pacer.bounds == (0.5, 8.0)
    fixed = Pacer(2.0, adaptive=False)
    assert fixed.after_batch(0.3, 100) == pytest.approx(0.6)
    assert fixed.after_batch(3.0, 100) == pytest.approx(6.0)
    assert fixed.bounds == (2.0, 2.0)
    assert Pacer(0.0).after_batch(5.0, 1) == 0.0


def test_pacer_copes_with_a_batch_too_short_to_measure():
    pacer = Pacer(1.0)
    assert pacer.after_batch(0.0, 0) == 0.0
    assert pacer.slowdown == 1.0
    assert pacer.after_batch(0.1, 10) == pytest.approx(0.64 * 0.1)


def test_pacer_refuses_a_negative_factor():
    with pytest.raises(ValueError, match="pause factor"):
        Pacer(-1.0)
