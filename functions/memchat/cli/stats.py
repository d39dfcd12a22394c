"""`memchat stats`: the operator's analytics as tables (or JSON)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from memchat.cli.base import database_url, err

if TYPE_CHECKING:
    import argparse

    from memchat.cli.base import Subcommands
    from memchat.usecases.analytics import Column, Report, Section


def cmd_stats(args: argparse.Namespace) -> int:
    """The operator's analytics (memchat_analytics, docs/analytics.md), read
    as memchat_analyst through DATABASE_URL's login."""
    from memchat.usecases import analytics

    if not 1 <= args.days <= analytics.MAX_DAYS:
        err(f"--days must be from 1 to {analytics.MAX_DAYS}")
        return 2
    try:
        report = analytics.read_report(database_url(), days=args.days, agent=args.agent)
    except analytics.AnalyticsError as exc:
        err(str(exc))
        return 1
    if report.note:
        err(f"note: {report.note}")
    print(json.dumps(report.as_dict(), indent=2) if args.json else render(report))
    return 0


def render(report: Report) -> str:
    """The report as aligned plain-text tables."""
    from memchat.usecases.analytics import SECTIONS

    window = _window(report.days)
    agent = f" for agent {report.agent}" if report.agent else ""
    lines = [
        f"memchat stats: {window} ({report.since} to {report.until}, UTC),"
        f" {'agent ' + report.agent if report.agent else 'all agents'}, read as {report.read_as}"
    ]
    for section in SECTIONS:
        lines += ["", section.title + _scope(section, report)]
        rows = report.rows[section.view]
        if not rows:
            lines.append(section.empty.format(window=window, agent=agent))
            continue
        lines += table(section.columns, rows)
        if section.view == "daily_usage":
            totals = report.totals
            lines.append(
                f"total: {totals['turns']} turns, {totals['prompt_tokens']} prompt and"
                f" {totals['completion_tokens']} completion tokens"
            )
    return "\n".join(lines)


def table(columns: tuple[Column, ...], rows: list[dict[str, Any]]) -> list[str]:
    """Header, a rule and the rows; numbers right-aligned, text left-aligned."""
    cells = [[_cell(c, row.get(c.name)) for c in columns] for row in rows]
    widths = [max([len(c.header)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]

    def line(values: list[str]) -> str:
        parts = [
            v.ljust(w) if c.kind in ("day", "text") else v.rjust(w)
            for c, v, w in zip(columns, values, widths, strict=True)
        ]
        return "  ".join(parts).rstrip()

    return [
        line([c.header for c in columns]),
        line(["-" * w for w in widths]),
        *(line(r) for r in cells),
    ]


def _cell(column: Column, value: Any) -> str:
    if value is None:
        return "-"
    if column.kind == "rate":
        return f"{float(value) * 100:.1f}%"
    if column.kind == "float":
        return f"{float(value):.1f}"
    return str(value)


def _window(days: int) -> str:
    return "the last day" if days == 1 else f"the last {days} days"


def _scope(section: Section, report: Report) -> str:
    if not section.by_day:
        return " (every stored session, all agents, not filtered by days)"
    if report.agent and not section.by_agent:
        return " (all agents)"
    return ""


def register(commands: Subcommands) -> None:
    stats = commands.add_parser(
        "stats", help="usage, feedback and memory analytics across all users"
    )
    stats.add_argument(
        "--days", type=int, default=7, help="the last N days, UTC, today included (default 7)"
    )
    stats.add_argument("--agent", default=None, help="only this agent, where a view has agents")
    stats.add_argument("--json", action="store_true", help="one JSON object instead of tables")
    stats.set_defaults(func=cmd_stats)
