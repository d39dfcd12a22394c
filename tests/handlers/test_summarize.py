"""The summary worker's function invoked with an EventBridge Scheduler event."""

from __future__ import annotations

import asyncio
import json
import uuid

import psycopg

from tests.handlers.conftest import FakeContext, LambdaRuntime, load_event
from tests.utils.api import ApiClient
from tests.utils.chat_api import chat

RUN_KEYS = {
    "summarized",
    "failed",
    "gave_up",
    "skipped",
    "remembered",
    "rounds",
    "tokens_in",
    "tokens_out",
    "lag_seconds",
    "duration_ms",
    "finished",
}
# The embedding backfill's run, which the same invocation returns under "embeddings".
EMBEDDING_KEYS = {
    "embedded",
    "memories",
    "sessions",
    "failed",
    "gave_up",
    "rounds",
    "fact_requests",
    "fact_tokens_in",
    "fact_tokens_out",
    "facts_unreadable",
    "analysed",
    "duration_ms",
    "finished",
    "refused",
}


def worker_context() -> FakeContext:
    return FakeContext(
        function_name="memchat-SummaryFunction-1a2B3c4D5e6F",
        memory_limit_in_mb=512,
        remaining_ms=120_000,
    )


async def test_a_scheduled_run_summarizes_due_sessions(
    lambda_: LambdaRuntime, api: ApiClient, admin: psycopg.Connection, capsys
) -> None:
    admin.execute("delete from memchat.summary_queue")  # other tests' sessions
    _, auth = api.new_user()
    first = await chat(api, auth, "turn 0", session_id=str(uuid.uuid4()))
    sid = first["session_id"]
    for i in range(1, 11):  # 22 messages: past the window (10) and the trigger (10)
        await chat(api, auth, f"turn {i}", session_id=sid)

    # The only due session (the queue was emptied): the run's lag is how long it
    # has waited, from its due_since to the run's start, in the database's clock.
    due_since, before = admin.execute(
        "select due_since, now() from memchat.summary_queue where session_id = %s",
        (uuid.UUID(sid),),
    ).fetchone()
    # A Lambda invocation runs with no event loop of its own running: a thread.
    event = load_event("summaries.json")
    result = await asyncio.to_thread(lambda_.invoke, "summarize", event, worker_context())
    (after,) = admin.execute("select now()").fetchone()

    assert set(result) == RUN_KEYS | {"embeddings"}
    assert set(result["embeddings"]) == EMBEDDING_KEYS
    assert result["summarized"] == 1 and result["finished"] is True
    waited = ((before - due_since).total_seconds(), (after - due_since).total_seconds())
    assert waited[0] - 0.05 <= result["lag_seconds"] <= waited[1] + 0.05, (result, waited)
    (summary,) = admin.execute(
        "select summary from public.chat_sessions where id = %s", (uuid.UUID(sid),)
    ).fetchone()
    assert summary and "turn 0" in summary
    logged = [r for r in lambda_.log_records() if "summaries" in r]
    assert logged and set(logged[-1]["summaries"]) == RUN_KEYS
    assert logged[-1]["correlation_id"] == load_event("summaries.json")["execution_id"]
    (metrics,) = [
        json.loads(line)
        for line in capsys.readouterr().out.splitlines()
        if "SessionsSummarized" in line
    ]
    assert metrics["SessionsSummarized"] == [1.0] and metrics["SummaryFailures"] == [0.0]
    assert "SummaryLag" in metrics and "SummaryTokensIn" in metrics

    again = await asyncio.to_thread(lambda_.invoke, "summarize", event, worker_context())
    assert again["summarized"] == 0 and again["finished"] is True


def test_the_worker_needs_no_token_settings(lambda_: LambdaRuntime, monkeypatch) -> None:
    """Its settings are narrowed to what it uses: the database and the model."""
    monkeypatch.delenv("SUPABASE_JWT_SECRET")
    module = lambda_.load("summarize")
    assert module.settings.job == "summaries" and module.settings.route_groups == frozenset()
    assert module.settings.supabase_jwt_secret is None


def test_the_templates_schedule_input_drives_the_handler(
    lambda_: LambdaRuntime, monkeypatch
) -> None:
    from tests.handlers.test_template import FUNCTIONS, events_of, handler_module

    monkeypatch.delenv("SUPABASE_JWT_SECRET")  # the worker has none
    ((function, schedule),) = [(f, e) for f, e in events_of("ScheduleV2") if f == "SummaryFunction"]
    event = json.loads(schedule["Input"])  # placeholders are filled in by the Scheduler
    result = lambda_.invoke(
        handler_module(FUNCTIONS[function]), event, FakeContext(function_name=function)
    )
    assert set(result) == RUN_KEYS | {"embeddings"} and result["failed"] == 0
    assert set(result["embeddings"]) == EMBEDDING_KEYS
    assert result["embeddings"]["refused"] is None
