"""`memchat stats`, run as an operator runs it (subprocesses), against a
database of its own on the test server with a few recorded turns."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from memchat import devdb
from memchat.store.db import Database
from tests.utils.analytics_data import (
    Fresh,
    Recorder,
    at,
    fresh_database,
    login_with_own_rights,
    turn,
    utc_today,
)
from tests.utils.users import UserFactory

MEMCHAT = [sys.executable, "-m", "memchat.cli"]


def stats(database_url: str, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "SUPABASE_"))}
    env.update(DATABASE_URL=database_url, MEMCHAT_HOME=str(cwd / ".memchat"))
    return subprocess.run(
        [*MEMCHAT, "stats", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )


@dataclass(frozen=True)
class Days:
    today: str
    day2: str  # two days ago
    day9: str  # nine days ago: outside the default window


@pytest.fixture(scope="module")
async def recorded(fresh: Fresh) -> AsyncIterator[Days]:
    """A and B talk to agent cli-x today (3 turns, two of them rated); A talked
    to agent other two days ago (rated 0); B talked to cli-x nine days ago."""
    users = UserFactory(fresh.admin)
    a, b = users.create(), users.create()
    today = utc_today(fresh.admin)
    day2, day9 = today - dt.timedelta(days=2), today - dt.timedelta(days=9)
    db = Database(fresh.api_url, max_connections=1)
    rec = Recorder(db, fresh.admin)
    try:
        _, (a1,) = await rec.session(
            a, "cli-x", [turn(at(today, "00:05"), "m-1", 100, 10, 120, recalled=1)],
            started=at(today, "00:04"),
        )  # fmt: skip
        _, (_, b2) = await rec.session(
            b, "cli-x",
            [turn(at(today, "00:06"), "m-1", 200, 20, 80),
             turn(at(today, "00:07"), "m-1", 300, 30, 100, summary_used=True)],
            started=at(today, "00:05"),
        )  # fmt: skip
        _, (o1,) = await rec.session(
            a, "other", [turn(at(day2, "12:00"), "m-2", 40, 4, 1000)], started=at(day2, "11:58")
        )
        _, (old,) = await rec.session(
            b, "cli-x", [turn(at(day9, "09:30"), "m-1", 5000, 500, 10)], started=at(day9, "09:00")
        )
        await rec.rate(a, a1, 1, at(today, "00:30"))
        await rec.rate(b, b2, -1, at(today, "00:30"), comment="not what I asked")
        await rec.rate(a, o1, 0, at(day2, "13:00"))
        await rec.rate(b, old, 1, at(day9, "10:00"))
    finally:
        await db.close()
    yield Days(today.isoformat(), day2.isoformat(), day9.isoformat())


def test_stats_json_for_one_agent_and_a_week(fresh: Fresh, recorded: Days, tmp_path: Path) -> None:
    result = stats(fresh.admin_url, tmp_path, "--json", "--days", "7", "--agent", "cli-x")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""  # read as memchat_analyst: nothing to note
    report = json.loads(result.stdout)
    today, day2 = recorded.today, recorded.day2
    assert report["read_as"] == "memchat_analyst" and report["as_analyst"] is True
    assert (report["days"], report["agent"], report["until"]) == (7, "cli-x", today)
    assert report["since"] == (dt.date.fromisoformat(today) - dt.timedelta(days=6)).isoformat()
    assert report["not_filtered_by_agent"] == [
        "daily_active_users",
        "daily_usage",
        "session_lengths",
    ]
    assert report["not_filtered_by_days"] == ["session_lengths"]
    # No agent column: every agent, the last 7 days (nine days ago is out).
    assert report["daily_active_users"] == [
        {"day": day2, "users": 1, "turns": 1},
        {"day": today, "users": 2, "turns": 3},
    ]
    assert report["daily_usage"] == [
        {"day": day2, "model": "m-2", "turns": 1, "users": 1, "prompt_tokens": 40,
         "completion_tokens": 4, "avg_latency_ms": 1000.0, "p95_latency_ms": 1000.0},
        {"day": today, "model": "m-1", "turns": 3, "users": 2, "prompt_tokens": 600,
         "completion_tokens": 60, "avg_latency_ms": 100.0, "p95_latency_ms": 118.0},
    ]  # fmt: skip
    assert report["totals"] == {"turns": 4, "prompt_tokens": 640, "completion_tokens": 64}
    # With an agent column: cli-x only.
    assert report["daily_feedback"] == [
        {"day": today, "agent_name": "cli-x", "ratings": 2, "positive": 1, "negative": 1,
         "neutral": 0, "with_comment": 1, "positive_rate": 0.5, "negative_rate": 0.5},
    ]  # fmt: skip
    assert report["daily_memory_use"] == [
        {"day": today, "agent_name": "cli-x", "turns": 3, "turns_with_recall": 1,
         "exchanges_recalled": 1, "turns_with_summary": 1, "recall_rate": 0.333,
         "summary_rate": 0.333},
    ]  # fmt: skip
    # Neither: every stored session.
    assert report["session_lengths"] == [
        {"bucket": "1 turn", "sessions": 3, "avg_turns": 1.0, "avg_duration_seconds": 660.0},
        {"bucket": "2-5 turns", "sessions": 1, "avg_turns": 2.0, "avg_duration_seconds": 120.0},
    ]
    assert "not what I asked" not in result.stdout  # no comment or message text


def test_stats_prints_aligned_tables(fresh: Fresh, recorded: Days, tmp_path: Path) -> None:
    result = stats(fresh.admin_url, tmp_path)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    today, day2, day9 = recorded.today, recorded.day2, recorded.day9
    since = (dt.date.fromisoformat(today) - dt.timedelta(days=6)).isoformat()
    assert out.splitlines()[0] == (
        f"memchat stats: the last 7 days ({since} to {today}, UTC), all agents,"
        " read as memchat_analyst"
    )
    expected_blocks = [
        f"""Daily active users
day         users  turns
----------  -----  -----
{day2}      1      1
{today}      2      3""",
        f"""Usage per day and model
day         model  turns  users  prompt tokens  completion tokens  avg ms  p95 ms
----------  -----  -----  -----  -------------  -----------------  ------  ------
{day2}  m-2        1      1             40                  4  1000.0  1000.0
{today}  m-1        3      2            600                 60   100.0   118.0
total: 4 turns, 640 prompt and 64 completion tokens""",
        f"""Feedback per agent and day
day         agent  ratings  +1  -1  0  comments  positive  negative
----------  -----  -------  --  --  -  --------  --------  --------
{day2}  other        1   0   0  1         0      0.0%      0.0%
{today}  cli-x        2   1   1  0         1     50.0%     50.0%""",
        """Session lengths (every stored session, all agents, not filtered by days)
turns      sessions  avg turns  avg duration s
---------  --------  ---------  --------------
1 turn            3        1.0           660.0
2-5 turns         1        2.0           120.0""",
        f"""Memory use per agent and day
day         agent  turns  with recall  recalled  with summary  recall rate  summary rate
----------  -----  -----  -----------  --------  ------------  -----------  ------------
{day2}  other      1            0         0             0         0.0%          0.0%
{today}  cli-x      3            1         1             1        33.3%         33.3%""",
    ]
    for block in expected_blocks:
        assert f"\n\n{block}\n" in out + "\n", f"missing:\n{block}\n--- in:\n{out}"
    assert day9 not in out


def test_stats_on_an_empty_database_says_so(
    admin: psycopg.Connection, admin_url: str, role_password: str | None, tmp_path: Path
) -> None:
    with fresh_database(admin, admin_url, role_password) as empty:
        text = stats(empty.admin_url, tmp_path, "--days", "3", "--agent", "cli-x")
        as_json = stats(empty.admin_url, tmp_path, "--json")
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines.count("no turns in the last 3 days") == 2  # active users, usage
    assert "no ratings in the last 3 days for agent cli-x" in lines
    assert "no turns in the last 3 days for agent cli-x" in lines
    assert "no stored session has a turn" in lines
    assert as_json.returncode == 0, as_json.stderr
    report = json.loads(as_json.stdout)
    for view in ("daily_active_users", "daily_usage", "daily_feedback", "session_lengths"):
        assert report[view] == []
    assert report["totals"] == {"turns": 0, "prompt_tokens": 0, "completion_tokens": 0}


def test_stats_as_a_login_without_the_rights_fails_with_a_sentence(
    fresh: Fresh, role_password: str | None, tmp_path: Path
) -> None:
    result = stats(fresh.url_as(devdb.CLEANUP_ROLE, role_password), tmp_path, "--json")
    assert result.returncode == 1 and result.stdout == ""
    assert "Traceback" not in result.stderr
    assert result.stderr.splitlines() == [
        "memchat_cleanup may not read memchat_analytics (permission denied for schema"
        " memchat_analytics): connect as the project owner, or grant memchat_analyst to"
        " memchat_cleanup (docs/analytics.md)"
    ]


def test_stats_as_a_login_that_cannot_become_the_analyst_says_so(
    fresh: Fresh, recorded: Days, role_password: str | None, tmp_path: Path
) -> None:
    """It reads with the login's own rights and says so on stderr and in the
    header. With the analyst's grants of its own (select on the views, which
    run with their owner's rights), it sees what the analyst sees."""
    with login_with_own_rights(fresh, role_password) as probe:
        result = stats(fresh.url_as(probe, role_password), tmp_path)
    as_analyst = stats(fresh.admin_url, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == [
        f"note: {probe} cannot set role memchat_analyst: read with {probe}'s own rights"
        f" (grant memchat_analyst to {probe} to read as the operator role)"
    ]
    lines = result.stdout.splitlines()
    assert lines[0].endswith(f", all agents, read as {probe}")
    assert lines[1:] == as_analyst.stdout.splitlines()[1:]
    assert "Daily active users" in lines and "no turns in the last 7 days" not in lines


@pytest.mark.parametrize("days", ["0", "-3", "36501"])
def test_stats_refuses_a_window_out_of_range(fresh: Fresh, tmp_path: Path, days: str) -> None:
    result = stats(fresh.admin_url, tmp_path, "--days", days)
    assert result.returncode == 2 and result.stderr.strip() == "--days must be from 1 to 36500"
