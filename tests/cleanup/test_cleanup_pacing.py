"""The cleanup's adaptive pause: longer while batches hurt or run slow, shorter when not.

`Cleanup` measures each batch with its `clock` and pauses with its
`sleep`; most tests below inject both (a clock that moves a fixed tick per
read, so that every batch "takes" the same time and its speed per row is
set by how many rows it deletes) and leave the latency probe out (it times
real round trips), against the real database: the rows each batch deletes
are the real ones, and so are the other transactions a test takes between
batches to stand for users' turns. One test uses the real clock and a real
lock wait; the probe is tested on its own connection to the real database.
`Pacer` itself is plain arithmetic: what it makes of the probe's latencies
is tested directly, last.
"""

from __future__ import annotations

import threading
import time
import uuid
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from memchat.usecases import cleanup
from memchat.usecases.cleanup import LatencyProbe, Pacer, TimeBudget
from tests.cleanup.conftest import Seeder, cleanup_on

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
    assert cleanup.IDLE_SECONDS == 10.0
    assert (cleanup.SLOW_BATCH, cleanup.FAST_BATCH) == (1.2, 1.1)
    assert (cleanup.HARM_SLOW, cleanup.HARM_FAST, cleanup.HARM_SMOOTHING) == (1.5, 1.2, 0.5)
    assert cleanup.PROBE_REFERENCE == 50
    assert (cleanup.BACKOFF, cleanup.SPEEDUP) == (1.5, 0.8)
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
    plan = [fast] * 3 + [bit_slower] + [slow] * 6 + [fast] * 13
    mine = _oldest_first(seed, user.user_id, plan)
    fake = FakeTime()

    result = cleanup_on(
        cleanup_url, batch_size=1, pause_factor=1.0, clock=fake.clock, sleep=fake.sleep, probe=False
    ).run()

    assert result.finished and not any(seed.exists(sid) for sid in mine)
    factors = [p / TICK for p in fake.pauses[: len(plan)]]
    expected = [
        *[0.8, 0.64, 0.512],  # nothing in the way: eases off from the configured 1
        0.512,  # 1.11x slower per row: holds
        *[0.768, 1.152, 1.728, 2.592, 3.888, 4.0],  # 2.5x slower: grows 1.5x, up to 4x the setting
        # back to the fast pace: shrinks again, down to a quarter of the setting
        *[3.2, 2.56, 2.048, 1.6384, 1.31072, 1.048576, 0.8388608, 0.67108864],
        *[0.536870912, 0.4294967296, 0.34359738368, 0.274877906944, 0.25],
    ]
    assert factors == pytest.approx(expected)


def test_bounds_follow_the_configured_factor(cleanup_url, users, seed: Seeder):
    user = users.create()
    mine = _oldest_first(seed, user.user_id, [9] + [3] * 4)
    fake = FakeTime()

    cleanup_on(
        cleanup_url, batch_size=1, pause_factor=0.5, clock=fake.clock, sleep=fake.sleep, probe=False
    ).run()

    assert not any(seed.exists(sid) for sid in mine)
    factors = [p / TICK for p in fake.pauses[:5]]
    # Starts at 0.5, eases to 0.4, then grows 1.5x a batch up to 4 x 0.5 = 2.
    assert factors == pytest.approx([0.4, 0.6, 0.9, 1.35, 2.0])


def test_a_fixed_factor_or_none_does_not_adapt(cleanup_url, users, seed: Seeder):
    user = users.create()
    plan = [9, 3, 3, 9]
    mine = _oldest_first(seed, user.user_id, plan)
    fake = FakeTime()
    cleanup_on(
        cleanup_url,
        batch_size=1,
        pause_factor=1.5,
        adaptive=False,
        clock=fake.clock,
        sleep=fake.sleep,
    ).run()
    assert not any(seed.exists(sid) for sid in mine)
    assert fake.pauses[: len(plan)] == pytest.approx([1.5 * TICK] * len(plan))

    mine = _oldest_first(seed, user.user_id, plan)
    flat_out = FakeTime()
    result = cleanup_on(
        cleanup_url, batch_size=1, pause_factor=0, clock=flat_out.clock, sleep=flat_out.sleep
    ).run()
    assert result.finished and not any(seed.exists(sid) for sid in mine)
    assert flat_out.pauses == []


@pytest.mark.plain_only  # this server's transaction counter
def test_others_writing_lengthens_the_pause_until_the_database_is_idle(
    cleanup_url, users, seed: Seeder
):
    user = users.create()
    mine = _oldest_first(seed, user.user_id, [2] * 12)  # equal batches: equal speed
    fake = FakeTime()
    writer = seed.admin  # another session of the database, autocommit

    def sleep(seconds: float) -> None:
        fake.sleep(seconds)
        if len(fake.pauses) <= 3:  # a user's turn commits during each of the first 3 pauses
            writer.execute("select pg_current_xact_id()")  # takes a transaction id

    cleanup_on(
        cleanup_url, batch_size=1, pause_factor=1.0, clock=fake.clock, sleep=sleep, probe=False
    ).run()

    assert not any(seed.exists(sid) for sid in mine)
    factors = [p / TICK for p in fake.pauses[:12]]
    # Nobody wrote before the first batch: eases off. Writes seen after each of
    # the next three: grows (no probe to say the batches are harmless). Then
    # still in use until IDLE_SECONDS (10 s of the fake clock) after the last
    # write was seen (at 6.4 s): held at the bound; idle from 17.75 s on: eases off.
    assert factors == pytest.approx(
        [0.8, 1.2, 1.8, 2.7, 4.0, 4.0, 4.0, 3.2, 2.56, 2.048, 1.6384, 1.31072]
    )


def test_a_pause_never_eats_into_the_next_batchs_time(cleanup_url, users, seed: Seeder):
    user = users.create()
    mine = _oldest_first(seed, user.user_id, [2, 2, 2])
    fake = FakeTime(tick=1.0)

    # The first batch takes 1 s and earns a pause of 80 s (factor 100, eased to
    # 80); with 60 s in all, that would leave less than 3x the batch for the
    # next: the run stops without sleeping and the next run goes on.
    first = cleanup_on(
        cleanup_url,
        batch_size=1,
        pause_factor=100,
        clock=fake.clock,
        sleep=fake.sleep,
        probe=False,
    ).run(TimeBudget(max_seconds=60))
    assert (first.batches, first.deleted_sessions, first.finished) == (1, 1, False)
    assert fake.pauses == []
    assert [seed.exists(sid) for sid in mine] == [False, True, True]

    # With room for both, it sleeps and goes on.
    ample = FakeTime(tick=1.0)
    second = cleanup_on(
        cleanup_url,
        batch_size=1,
        pause_factor=100,
        clock=ample.clock,
        sleep=ample.sleep,
        probe=False,
    ).run(TimeBudget(max_seconds=1000))
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
                " where user_id = %s and active_session_id = %s for update",
                (user.user_id, held),
            )
            locked.set()
            turn.execute("select pg_sleep(%s)", (hold_seconds,))

    reads: list[float] = []

    def clock() -> float:  # the real clock, its readings kept
        reads.append(time.monotonic())
        return reads[-1]

    holder = threading.Thread(target=hold_the_pointer)
    holder.start()
    try:
        assert locked.wait(10)
        pauses: list[float] = []
        result = cleanup_on(cleanup_url, batch_size=1, clock=clock, sleep=pauses.append).run()
    finally:
        holder.join()

    assert result.finished
    assert not any(seed.exists(sid) for sid in (before, held, after))
    # Reads: the start, then each batch's start and end.
    first, second = reads[2] - reads[1], reads[4] - reads[3]
    assert second > 0.2  # it waited for the lock
    # After the first batch the factor eased off (0.8) or, counting the
    # holder's transaction as another's write, grew (1.5). The second batch,
    # held up, is far slower per row than the first: the factor grows 1.5x.
    factors = pauses[0] / first, pauses[1] / second
    assert factors[0] <= 1.5
    assert factors[1] == pytest.approx(1.5 * factors[0])


# ------------------------------------------------------------ the probe


def _probe_connections(admin) -> int:
    row = admin.execute(
        "select count(*) from pg_stat_activity where application_name = %s",
        (cleanup.PROBE_APPLICATION_NAME,),
    ).fetchone()
    return int(row[0])


def test_the_probe_times_round_trips_on_its_own_connection(cleanup_url, admin):
    with LatencyProbe(cleanup_url, interval=0.005) as probe:
        assert probe.running
        assert _probe_connections(admin) == 1
        samples: list[float] = []
        for _ in range(200):  # up to 2 s for a handful of samples
            samples += probe.take()  # each sample handed over once
            if len(samples) >= 5:
                break
            time.sleep(0.01)
        assert len(samples) >= 5
        assert all(0 < ms < 1000 for ms in samples)
    assert not probe.running
    assert _gone(admin)


def _gone(admin, seconds: float = 5.0) -> bool:
    """Whether the probe's backend has left pg_stat_activity: the server ends
    it just after the client closes, not at once."""
    deadline = time.monotonic() + seconds
    while _probe_connections(admin):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_a_probe_whose_connection_dies_stops_quietly(cleanup_url, admin, caplog):
    with LatencyProbe(cleanup_url, interval=0.005) as probe:
        for _ in range(200):
            if probe.take():
                break
            time.sleep(0.01)
        admin.execute(
            "select pg_terminate_backend(pid) from pg_stat_activity where application_name = %s",
            (cleanup.PROBE_APPLICATION_NAME,),
        )
        for _ in range(200):
            if not probe.running:
                break
            time.sleep(0.01)
        assert not probe.running
        probe.take()
        assert probe.take() == []
    assert "latency probe stopped" in caplog.text


def test_without_its_probe_the_cleanup_still_runs(cleanup_url, users, seed: Seeder, caplog):
    unreachable = "postgresql://nobody@127.0.0.1:1/none?connect_timeout=1"
    with LatencyProbe(unreachable) as probe:
        assert not probe.running
        assert probe.take() == []
    assert "latency probe unavailable" in caplog.text

    user = users.create()
    mine = _oldest_first(seed, user.user_id, [1, 1, 1])
    pauses: list[float] = []
    result = cleanup_on(cleanup_url, batch_size=1, sleep=pauses.append).run()  # probing
    assert result.finished and not any(seed.exists(sid) for sid in mine)
    assert len(pauses) >= 3
    assert _gone(seed.admin)  # closed with the run (its backend leaves just after)


def test_no_probe_when_it_would_not_be_used(cleanup_url, admin, users, seed: Seeder):
    seen: list[int] = []

    def sleep(_: float) -> None:
        seen.append(_probe_connections(admin))

    user = users.create()
    _oldest_first(seed, user.user_id, [1, 1])
    cleanup_on(cleanup_url, batch_size=1, sleep=sleep).run()
    assert seen and all(n == 1 for n in seen)  # the default: probing while it runs
    for options in ({"adaptive": False}, {"probe": False}):
        _oldest_first(seed, user.user_id, [1, 1])
        seen.clear()
        cleanup_on(cleanup_url, batch_size=1, sleep=sleep, **options).run()
        assert seen and all(n == 0 for n in seen), options


# ------------------------------------------------------------- Pacer alone


def test_pacer_backs_off_when_the_probe_is_slower_during_batches():
    pacer = Pacer(1.0)
    calm = [1.0] * 10  # ms, answered during the pauses

    def batch(during_ms: float) -> float:
        # Batches at the same speed throughout, with others writing (users are
        # there): only the probe's latency differs.
        pacer.after_batch(1.0, 100, writes=3, probes_during=[during_ms] * 5, probes_before=calm)
        return pacer.factor

    assert batch(1.1) == pytest.approx(0.8)
    assert pacer.harm == pytest.approx(1.1)  # under HARM_FAST: eases off
    assert batch(1.9) == pytest.approx(1.2)
    assert pacer.harm == pytest.approx(1.5)  # smoothed: (1.1 + 1.9) / 2, harmful
    assert batch(1.3) == pytest.approx(1.2)
    assert pacer.harm == pytest.approx(1.4)  # neither: holds
    assert [batch(3.0) for _ in range(3)] == pytest.approx([1.8, 2.7, 4.0])  # to the bound
    assert pacer.harm == pytest.approx(2.8)
    # Calm batches again: the smoothed harm comes down over a few of them
    # (1.9, 1.45, 1.225: held) before the factor does (1.1125: eases off).
    assert [batch(1.0) for _ in range(4)] == pytest.approx([4.0, 4.0, 4.0, 3.2])


def test_pacer_compares_with_the_recent_pauses_probes():
    pacer = Pacer(1.0)
    # Slow probes everywhere (a busy host or a far database): not the batch's doing.
    pacer.after_batch(1.0, 100, writes=1, probes_during=[5.0] * 5, probes_before=[5.0] * 50)
    assert pacer.harm == pytest.approx(1.0) and pacer.factor == pytest.approx(0.8)
    # The reference keeps the last PROBE_REFERENCE pause probes: after 50 at
    # 1 ms, 5 ms during a batch is 5x (smoothed with the 1x before: 3x).
    pacer.after_batch(1.0, 100, writes=1, probes_during=[5.0] * 5, probes_before=[1.0] * 50)
    assert pacer.harm == pytest.approx(3.0) and pacer.factor == pytest.approx(1.2)
    # No probe answered during a short batch: the harm so far stands.
    pacer.after_batch(1.0, 100, writes=1, probes_during=[], probes_before=[1.0] * 10)
    assert pacer.harm == pytest.approx(3.0) and pacer.factor == pytest.approx(1.8)


def test_pacer_ignores_the_harm_while_nobody_writes():
    pacer = Pacer(1.0)
    harmful = {"probes_during": [3.0] * 5, "probes_before": [1.0] * 10}
    pacer.after_batch(1.0, 100, at=0.0, writes=2, **harmful)
    assert (pacer.active, pacer.factor) == (True, pytest.approx(1.5))
    # Nobody else wrote since: still in use until IDLE_SECONDS have passed.
    pacer.after_batch(1.0, 100, at=cleanup.IDLE_SECONDS - 0.1, **harmful)
    assert (pacer.active, pacer.factor) == (True, pytest.approx(2.25))
    # Then idle: the batch slows nobody, whatever the probe says.
    pacer.after_batch(1.0, 100, at=cleanup.IDLE_SECONDS, **harmful)
    assert (pacer.active, pacer.factor) == (False, pytest.approx(1.8))
    assert pacer.harm is not None and pacer.harm >= cleanup.HARM_SLOW


def test_pacer_without_a_probe_backs_off_whenever_others_write():
    pacer = Pacer(1.0)
    assert pacer.after_batch(1.0, 100, at=1.0, writes=1) == pytest.approx(1.5)
    assert pacer.harm is None
    assert pacer.after_batch(1.0, 100, at=20.0) == pytest.approx(1.2)  # idle since


def test_a_slow_batch_backs_off_even_if_the_probe_saw_nothing():
    pacer = Pacer(1.0)
    calm = {"probes_during": [1.0], "probes_before": [1.0]}
    pacer.after_batch(1.0, 100, writes=1, **calm)
    pacer.after_batch(2.0, 100, writes=1, **calm)  # 2x slower per row, probe calm
    assert pacer.slowdown == pytest.approx(2.0) and pacer.factor == pytest.approx(1.2)


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
        [1.2, 1.8, 2.7, 4.0, 4.0, 4.0, 4.0, 4.0, 4.0]
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
