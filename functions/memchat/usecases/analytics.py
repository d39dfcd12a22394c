"""The operator's analytics (`memchat stats`): the `memchat_analytics` views.

Every number comes from the views of migration
supabase/schemas/views.sql; docs/analytics.md says what each view and
column means. The views run with their owner's rights and carry numbers
only (counts, tokens, latencies, ratings, timings, model and agent names;
users and sessions as keyed hashes, none of which this report reads): no
text a user wrote, and no id. Reading them takes select on the views, which
`memchat_analyst` has and nothing else, so they are read in one read-only
transaction that first switches to it (`set local role`): what
`memchat stats` shows is exactly what the operator role may see. A login
that cannot switch to it (not a member) reads with its own rights instead,
and the report says so: the views' owner (the project's `postgres`) sees
the same rows, a login without select on the views is refused. Nothing
here logs.

The day-by-day views are read for the last `days` days (UTC, today
included), and those that have an `agent_name` for one agent when asked.
`daily_active_users` and `daily_usage` have no agent column, and
`session_lengths` has neither a day nor an agent column: the report says
which sections are not filtered. `memchat stats` shows it (memchat.cli.stats:
tables, or JSON).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from memchat.store.analytics import (
    ANALYST_ROLE,
    SCHEMA,
    AnalyticsError,
    Column,
    Section,
    first_line,
    read_views,
)

if TYPE_CHECKING:
    import psycopg

__all__ = ["ANALYST_ROLE", "SCHEMA", "AnalyticsError", "Column", "Section"]

DEFAULT_DAYS = 7
MAX_DAYS = 36500  # a hundred years: any longer window is a typo


def _col(name: str, header: str, kind: str = "int") -> Column:
    return Column(name, header, kind)


DAY = _col("day", "day", "day")
AGENT = _col("agent_name", "agent", "text")

SECTIONS = (
    Section(
        view="daily_active_users",
        title="Daily active users",
        columns=(DAY, _col("users", "users"), _col("turns", "turns")),
        order=("day",),
        by_day=True,
        by_agent=False,
        empty="no turns in {window}",
    ),
    Section(
        view="daily_usage",
        title="Usage per day and model",
        columns=(
            DAY,
            _col("model", "model", "text"),
            _col("turns", "turns"),
            _col("users", "users"),
            _col("prompt_tokens", "prompt tokens"),
            _col("completion_tokens", "completion tokens"),
            _col("avg_latency_ms", "avg ms", "float"),
            _col("p95_latency_ms", "p95 ms", "float"),
        ),
        order=("day", "model"),
        by_day=True,
        by_agent=False,
        empty="no turns in {window}",
    ),
    Section(
        view="daily_feedback",
        title="Feedback per agent and day",
        columns=(
            DAY,
            AGENT,
            _col("ratings", "ratings"),
            _col("positive", "+1"),
            _col("negative", "-1"),
            _col("neutral", "0"),
            _col("with_comment", "comments"),
            _col("positive_rate", "positive", "rate"),
            _col("negative_rate", "negative", "rate"),
        ),
        order=("day", "agent_name"),
        by_day=True,
        by_agent=True,
        empty="no ratings in {window}{agent}",
    ),
    Section(
        view="session_lengths",
        title="Session lengths",
        columns=(
            _col("bucket", "turns", "text"),
            _col("sessions", "sessions"),
            _col("avg_turns", "avg turns", "float"),
            _col("avg_duration_seconds", "avg duration s", "float"),
        ),
        order=("lower_bound",),
        by_day=False,
        by_agent=False,
        empty="no stored session has a turn",
    ),
    Section(
        view="daily_memory_use",
        title="Memory use per agent and day",
        columns=(
            DAY,
            AGENT,
            _col("turns", "turns"),
            _col("turns_with_recall", "with recall"),
            _col("exchanges_recalled", "recalled"),
            _col("turns_with_summary", "with summary"),
            _col("recall_rate", "recall rate", "rate"),
            _col("summary_rate", "summary rate", "rate"),
        ),
        order=("day", "agent_name"),
        by_day=True,
        by_agent=True,
        empty="no turns in {window}{agent}",
    ),
)
VIEWS = tuple(s.view for s in SECTIONS)


@dataclass(frozen=True)
class Report:
    days: int
    agent: str | None
    since: dt.date  # the first day read (UTC)
    until: dt.date  # today (UTC)
    login: str  # the role the connection logged in as
    read_as: str  # the role the views were read as
    rows: dict[str, list[dict[str, Any]]]  # per view, in SECTIONS order

    @property
    def as_analyst(self) -> bool:
        return self.read_as == ANALYST_ROLE

    @property
    def note(self) -> str | None:
        """Why the report was not read as memchat_analyst, if it was not."""
        if self.as_analyst:
            return None
        return (
            f"{self.login} cannot set role {ANALYST_ROLE}: read with {self.login}'s own rights"
            f" (grant {ANALYST_ROLE} to {self.login} to read as the operator role)"
        )

    @property
    def totals(self) -> dict[str, int]:
        """Turns and tokens over the window (daily_usage: every agent)."""
        usage = self.rows["daily_usage"]
        return {
            key: sum(int(r[key]) for r in usage)
            for key in ("turns", "prompt_tokens", "completion_tokens")
        }

    def as_dict(self) -> dict[str, Any]:
        """The report as JSON-ready values (days as ISO dates)."""
        result: dict[str, Any] = {
            "days": self.days,
            "since": self.since.isoformat(),
            "until": self.until.isoformat(),
            "agent": self.agent,
            "read_as": self.read_as,
            "as_analyst": self.as_analyst,
            "not_filtered_by_agent": [s.view for s in SECTIONS if not s.by_agent],
            "not_filtered_by_days": [s.view for s in SECTIONS if not s.by_day],
        }
        for view, rows in self.rows.items():
            result[view] = [
                {k: v.isoformat() if isinstance(v, dt.date) else v for k, v in row.items()}
                for row in rows
            ]
        result["totals"] = self.totals
        return result


# ------------------------------------------------------------------ read


def read_report(conninfo: str, *, days: int = DEFAULT_DAYS, agent: str | None = None) -> Report:
    """Connect, read every view (see `read`), disconnect."""
    import psycopg

    from memchat.store.db import connect

    try:
        conn = connect(conninfo)
    except psycopg.OperationalError as exc:
        raise AnalyticsError(f"cannot connect to the database: {first_line(exc)}") from exc
    with conn:
        return read(conn, days=days, agent=agent)


def read(conn: psycopg.Connection[Any], *, days: int, agent: str | None) -> Report:
    """Every view's rows for the last `days` days (UTC) and `agent` (None:
    all), as memchat_analyst where the login may become it
    (store.analytics.read_views)."""
    if not 1 <= days <= MAX_DAYS:
        raise ValueError(f"days must be from 1 to {MAX_DAYS}")
    read_ = read_views(conn, SECTIONS, days=days, agent=agent)
    return Report(days, agent, read_.since, read_.until, read_.login, read_.read_as, read_.rows)
