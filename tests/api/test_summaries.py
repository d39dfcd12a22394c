"""Rolling summaries: sessions queued by their turns, summarized by the
worker (usecases/summarize.py) as their owners, shown to later turns.

The worker logs in as `memchat_worker` and talks to the same local
OpenAI-compatible server as the API; summaries it writes are echoes of its
prompt (the fake model echoes), which is what lets the tests see exactly
what each refresh was given."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import psycopg
import pytest

from memchat import store
from memchat.config import Settings
from memchat.errors import DatabasePermissionDenied
from memchat.model.client import ModelClient
from memchat.prompts.summary import SUMMARY_INSTRUCTIONS
from memchat.store.db import Database
from memchat.usecases.cleanup import Cleanup
from memchat.usecases.summarize import Summarizer
from tests.conftest import make_settings
from tests.utils.api import ApiClient
from tests.utils.chat_api import chat, kinds, remembered, system_texts
from tests.utils.fake_openai import FakeOpenAI

WINDOW = 10
TRIGGER = 4


def summary_request(request: dict[str, Any]) -> bool:
    first = request["messages"][0]
    return first["role"] == "system" and first["content"].startswith(
        SUMMARY_INSTRUCTIONS.split("{", 1)[0]
    )


def summary_requests(model: FakeOpenAI) -> list[dict[str, Any]]:
    return [r for r in model.requests if summary_request(r)]


def summary_block(request: dict[str, Any]) -> str | None:
    """The summary the model was sent in the memory block, unquoted, if any."""
    return remembered(request).summary or None


def session_summary(admin: psycopg.Connection, session_id: str) -> tuple[Any, ...]:
    row = admin.execute(
        "select summary, summary_covers_until, summary_covers_count, summary_updated_at"
        " from public.chat_sessions where id = %s",
        (uuid.UUID(session_id),),
    ).fetchone()
    assert row is not None
    return tuple(row)


def queued(admin: psycopg.Connection, session_id: str) -> tuple[int, str] | None:
    """(attempts, when it may be tried next: 'now', 'later' or 'never'), or None."""
    row = admin.execute(
        "select attempts, case when next_attempt_at = 'infinity' then 'never'"
        " when next_attempt_at > now() then 'later' else 'now' end"
        " from memchat.summary_queue where session_id = %s",
        (uuid.UUID(session_id),),
    ).fetchone()
    return (row[0], row[1]) if row else None


@pytest.fixture(autouse=True)
def empty_queue(admin: psycopg.Connection) -> None:
    """The worker serves every due session in the database: start each test
    with none queued by other tests, so what a run does is this test's."""
    admin.execute("delete from memchat.summary_queue")


@pytest.fixture
def summary_settings(database_url: str, model: FakeOpenAI) -> Settings:
    return make_settings(
        database_url,
        model.url,
        memory_max_history_messages=WINDOW,
        summary_trigger_messages=TRIGGER,
        memory_recall_k=0,
    )


@pytest.fixture
async def api(summary_settings: Settings) -> AsyncIterator[ApiClient]:
    client = ApiClient(summary_settings)
    yield client
    await client.aclose()


@pytest.fixture
async def workers(
    worker_url: str, summary_settings: Settings
) -> AsyncIterator[Callable[..., Summarizer]]:
    made: list[tuple[Database, ModelClient]] = []

    def build(**overrides: object) -> Summarizer:
        settings = summary_settings.model_copy(update={"database_url": worker_url, **overrides})
        db = Database(worker_url, max_connections=2)
        model = ModelClient(settings)
        made.append((db, model))
        return Summarizer(db=db, model=model, settings=settings)

    yield build
    for db, model in made:
        await db.close()
        await model.close()


async def long_session(api: ApiClient, auth: dict[str, str], turns: int, tag: str = "m") -> str:
    """A new session of `turns` turns (2 messages each)."""
    first = await chat(api, auth, f"{tag}0 hello", session_id=str(uuid.uuid4()))
    for i in range(1, turns):
        await chat(api, auth, f"{tag}{i} more", session_id=first["session_id"])
    return str(first["session_id"])


# ---------------------------------------------------------------- the flow


async def test_a_long_session_gets_a_summary_that_the_next_turn_sees(
    api: ApiClient,
    model: FakeOpenAI,
    admin: psycopg.Connection,
    workers: Callable[..., Summarizer],
) -> None:
    _, auth = api.new_user()
    sid = await long_session(api, auth, 20)  # 40 messages
    assert queued(admin, sid) is not None
    model.reset()

    run = await workers().run(max_seconds=30)

    assert run.summarized >= 1 and run.failed == 0
    summary, covers_until, covers_count, updated_at = session_summary(admin, sid)
    assert summary and updated_at is not None
    # The oldest messages are covered; the window's are not.
    sent = summary_requests(model)[0]["messages"][1]["content"]
    assert "User: m0 hello" in sent and "User: m19 more" not in sent
    assert covers_count >= 40 - WINDOW - 2
    assert queued(admin, sid) is None

    body = await chat(api, auth, "and now?", session_id=sid)

    assert summary_block(model.requests[-1]) == summary
    assert not any(summary in text for text in system_texts(model.requests[-1]))
    assert body["memory"]["summary_used"] is True
    assert body["memory"]["summary_covers_until"] == covers_until


async def test_the_summary_block_sits_before_the_window(
    api: ApiClient, model: FakeOpenAI, workers: Callable[..., Summarizer]
) -> None:
    _, auth = api.new_user()
    sid = await long_session(api, auth, 12)
    await workers().run(max_seconds=30)
    await chat(api, auth, "next", session_id=sid)
    request = model.requests[-1]
    assert kinds(request)[:3] == ["system", "memory", "user"]
    assert summary_block(request)


async def test_a_refresh_sends_only_the_old_summary_and_the_new_messages(
    api: ApiClient,
    model: FakeOpenAI,
    admin: psycopg.Connection,
    workers: Callable[..., Summarizer],
) -> None:
    _, auth = api.new_user()
    sid = await long_session(api, auth, 12, tag="a")
    await workers().run(max_seconds=30)
    first_summary, covers_until, _, _ = session_summary(admin, sid)
    for i in range(6):
        await chat(api, auth, f"b{i} later", session_id=sid)
    model.reset()

    await workers().run(max_seconds=30)

    (request,) = summary_requests(model)
    sent = request["messages"][1]["content"]
    assert sent.startswith(f"Summary so far:\n{first_summary}\n")
    new_part = sent.rsplit("New messages:", 1)[1]  # the old summary echoes its own
    assert "User: b0 later" in new_part
    assert "User: a0 hello" not in new_part and "User: a1 more" not in new_part
    assert session_summary(admin, sid)[1] > covers_until


def window_start(admin: psycopg.Connection, session_id: str) -> tuple[int, int]:
    """(the id of the window's oldest message, the id of the message just before
    it): the window is the session's last WINDOW user and final assistant messages."""
    ids = [
        row[0]
        for row in admin.execute(
            "select id from public.chat_message_history where session_id = %s"
            " and message->>'type' <> 'tool' order by id desc",
            (uuid.UUID(session_id),),
        ).fetchall()
    ]
    return ids[WINDOW - 1], ids[WINDOW]


async def test_one_pass_brings_the_summary_up_to_the_windows_start(
    api: ApiClient, admin: psycopg.Connection, workers: Callable[..., Summarizer]
) -> None:
    """Review finding 0: a pass stopped once the session was no longer due,
    which could leave the summary short of the window's start (a hole that
    lasted until the next trigger). Now one pass refreshes chunk after chunk
    until nothing before the window is left out."""
    _, auth = api.new_user()
    sid = await long_session(api, auth, 14)  # 28 messages: 18 before the window

    run = await workers(summary_chunk_messages=2).run(max_seconds=60)

    assert run.summarized == 9 and run.failed == 0  # 18 messages, 2 a chunk
    _, just_before = window_start(admin, sid)
    assert session_summary(admin, sid)[1] == just_before
    assert queued(admin, sid) is None


async def test_the_summary_stays_in_use_between_refreshes(
    api: ApiClient, model: FakeOpenAI, admin: psycopg.Connection, workers: Callable[..., Summarizer]
) -> None:
    """Messages that left the window since the last refresh (fewer than the
    trigger) stay in the prompt with the summary: no hole, so the summary is
    used on every turn, not only on the one right after a refresh."""
    _, auth = api.new_user()
    sid = await long_session(api, auth, 12)
    await workers().run(max_seconds=30)
    covers_until = session_summary(admin, sid)[1]
    for i in range(2):  # 4 messages leave the window; not due again yet
        await chat(api, auth, f"after {i}", session_id=sid)

    body = await chat(api, auth, "still there?", session_id=sid)

    assert body["memory"]["summary_used"] is True
    assert body["memory"]["summary_covers_until"] == covers_until
    # The window reaches back to the summary: 10 + the 4 newly out of it.
    assert body["memory"]["messages_in_context"] == WINDOW + 4
    sent = [m["content"] for m in model.requests[-1]["messages"] if m["role"] == "user"]
    assert "m11 more" in sent and "after 0" in sent


async def test_a_short_session_is_never_queued(api: ApiClient, admin: psycopg.Connection) -> None:
    _, auth = api.new_user()
    sid = await long_session(api, auth, (WINDOW + TRIGGER) // 2 - 1)
    assert queued(admin, sid) is None


async def test_use_memory_false_shows_no_summary(
    api: ApiClient, model: FakeOpenAI, workers: Callable[..., Summarizer]
) -> None:
    _, auth = api.new_user()
    sid = await long_session(api, auth, 12)
    await workers().run(max_seconds=30)
    body = await chat(api, auth, "quiet", session_id=sid, use_memory=False)
    assert summary_block(model.requests[-1]) is None
    assert body["memory"]["summary_used"] is False


async def test_no_summary_is_shown_that_would_leave_a_hole_before_the_window(
    api: ApiClient,
    model: FakeOpenAI,
    admin: psycopg.Connection,
    workers: Callable[..., Summarizer],
) -> None:
    """The worker is behind: messages have left the window since the summary
    was made. Overlap is fine, a hole is not: the summary is not shown."""
    _, auth = api.new_user()
    sid = await long_session(api, auth, 12)
    await workers().run(max_seconds=30)
    for i in range(8):  # more than the window moves on beyond the summary
        await chat(api, auth, f"later {i}", session_id=sid)
    body = await chat(api, auth, "now?", session_id=sid)
    assert body["memory"]["summary_used"] is False
    assert summary_block(model.requests[-1]) is None
    await workers().run(max_seconds=30)  # the worker catches up
    body = await chat(api, auth, "and now?", session_id=sid)
    assert body["memory"]["summary_used"] is True


# ---------------------------------------------------------- concurrency


async def test_two_workers_never_summarize_one_session_twice(
    api: ApiClient,
    model: FakeOpenAI,
    admin: psycopg.Connection,
    workers: Callable[..., Summarizer],
) -> None:
    _, auth = api.new_user()
    sessions = [await long_session(api, auth, 8, tag=f"s{n}-") for n in range(6)]
    model.reset()
    model.script(*[{"delay": 0.2}] * 12)  # summaries take a moment

    runs = await asyncio.gather(
        workers(summary_batch_size=2).run(max_seconds=30),
        workers(summary_batch_size=2).run(max_seconds=30),
    )

    per_session = [
        sum(
            1
            for r in summary_requests(model)
            if f"User: s{n}-0 hello" in r["messages"][1]["content"]
        )
        for n in range(6)
    ]
    assert per_session == [1] * 6
    assert sum(r.summarized for r in runs) == 6
    assert all(session_summary(admin, sid)[0] for sid in sessions)


async def test_turns_recorded_while_the_worker_runs_lose_nothing_and_wait_for_no_model_call(
    api: ApiClient,
    model: FakeOpenAI,
    admin: psycopg.Connection,
    workers: Callable[..., Summarizer],
) -> None:
    _, auth = api.new_user()
    sid = await long_session(api, auth, 10)
    model.reset()
    model.script({"delay": 2.0})  # the summary: slow
    worker = asyncio.create_task(workers().run(max_seconds=30))
    while not summary_requests(model):
        await asyncio.sleep(0.02)

    for i in range(3):
        await chat(api, auth, f"during {i}", session_id=sid)
    # The turns went through while the worker was still waiting for its model.
    assert not worker.done()
    run = await worker

    assert run.summarized >= 1  # the turns may have made it due again meanwhile
    (count,) = admin.execute(
        "select count(*) from public.chat_message_history where session_id = %s",
        (uuid.UUID(sid),),
    ).fetchone()
    assert count == 26
    summary, covers_until, _, _ = session_summary(admin, sid)
    assert summary and covers_until is not None


# ------------------------------------------------------------- failures


async def test_a_failed_summary_keeps_the_old_one_and_retries_later(
    api: ApiClient,
    model: FakeOpenAI,
    admin: psycopg.Connection,
    workers: Callable[..., Summarizer],
) -> None:
    _, auth = api.new_user()
    sid = await long_session(api, auth, 12)
    await workers().run(max_seconds=30)
    before = session_summary(admin, sid)
    for i in range(8):
        await chat(api, auth, f"more {i}", session_id=sid)
    model.script({"status": 500})

    run = await workers().run(max_seconds=30)

    assert (run.summarized, run.failed) == (0, 1)
    assert session_summary(admin, sid) == before
    assert queued(admin, sid) == (1, "later")  # backing off
    assert (await workers().run(max_seconds=30)).summarized == 0  # not retried at once

    admin.execute(
        "update memchat.summary_queue set next_attempt_at = now() where session_id = %s",
        (uuid.UUID(sid),),
    )
    assert (await workers().run(max_seconds=30)).summarized == 1
    assert session_summary(admin, sid)[1] > before[1]


async def test_a_session_that_keeps_failing_is_given_up_until_its_next_turn(
    api: ApiClient,
    model: FakeOpenAI,
    admin: psycopg.Connection,
    workers: Callable[..., Summarizer],
    caplog: pytest.LogCaptureFixture,
) -> None:
    _, auth = api.new_user()
    sid = await long_session(api, auth, 12)
    worker = workers(summary_max_attempts=2)
    for _ in range(2):
        model.script({"status": 500})
        admin.execute(
            "update memchat.summary_queue set next_attempt_at = now() where session_id = %s",
            (uuid.UUID(sid),),
        )
        with caplog.at_level("INFO"):
            run = await worker.run(max_seconds=30)
    assert run.gave_up == 1
    assert queued(admin, sid) == (2, "never")
    assert "summary given up" in caplog.text
    assert (await worker.run(max_seconds=30)).summarized == 0  # not looping

    await chat(api, auth, "one more turn", session_id=sid)  # the next turn: try again
    assert (await worker.run(max_seconds=30)).summarized == 1


# ------------------------------------------------------------ lifecycle


async def test_clear_session_and_delete_me_remove_summaries_and_queue_rows(
    api: ApiClient, admin: psycopg.Connection, workers: Callable[..., Summarizer]
) -> None:
    _, auth = api.new_user()
    cleared = await long_session(api, auth, 12, tag="c")
    erased = await long_session(api, auth, 12, tag="e")
    await workers().run(max_seconds=30)
    assert session_summary(admin, cleared)[0] and session_summary(admin, erased)[0]
    await chat(api, auth, "x", session_id=cleared)

    response = await api.post("/chat/clear-session", json={"session_id": cleared}, headers=auth)
    assert response.status_code == 200
    assert session_summary(admin, cleared) == (None, None, 0, None)
    assert queued(admin, cleared) is None

    assert (await api.delete("/me", headers=auth)).status_code == 200
    (left,) = admin.execute(
        "select count(*) from public.chat_sessions where id = %s", (uuid.UUID(erased),)
    ).fetchone()
    assert left == 0


async def test_the_ttl_cleanup_removes_summaries_with_their_sessions(
    api: ApiClient,
    admin: psycopg.Connection,
    cleanup_url: str,
    workers: Callable[..., Summarizer],
) -> None:
    _, auth = api.new_user()
    sid = await long_session(api, auth, 12)
    await chat(api, auth, "queued again", session_id=sid)
    admin.execute(
        "update public.chat_sessions set expires_at = now() - interval '1 minute' where id = %s",
        (uuid.UUID(sid),),
    )
    assert (await workers().run(max_seconds=30)).summarized == 0  # expired: skipped
    Cleanup(cleanup_url, batch_size=1000, pause_factor=1.0).run()
    (left,) = admin.execute(
        "select (select count(*) from public.chat_sessions where id = %(s)s)"
        " + (select count(*) from memchat.summary_queue where session_id = %(s)s)",
        {"s": uuid.UUID(sid)},
    ).fetchone()
    assert left == 0


async def summary_memories(api: ApiClient, auth: dict[str, str], **params: Any) -> list[Any]:
    response = await api.get("/memories", params=params, headers=auth)
    assert response.status_code == 200, response.text
    return [m for m in response.json()["memories"] if m["kind"] == "summary"]


async def test_the_summary_outlives_its_session_as_a_memory(
    api: ApiClient,
    admin: psycopg.Connection,
    cleanup_url: str,
    workers: Callable[..., Summarizer],
    summary_settings: Settings,
) -> None:
    _, auth = api.new_user()
    sid = await long_session(api, auth, 12, tag="a")
    assert (await workers().run(max_seconds=30)).remembered == 1
    summary, covers_until, _, _ = session_summary(admin, sid)
    (kept,) = await summary_memories(api, auth)
    assert kept["text"] == summary and kept["session_id"] == sid
    assert kept["message_id"] == covers_until and kept["expires_at"] is not None
    (model_name, embedded) = admin.execute(
        "select model, embedding is not null from memchat.memories where id = %s", (kept["id"],)
    ).fetchone() or (None, False)
    assert model_name == summary_settings.openai_embedding_model and embedded
    # A refresh replaces it: one summary memory per session, the latest.
    for i in range(6):
        await chat(api, auth, f"b{i} later", session_id=sid)
    assert (await workers().run(max_seconds=30)).remembered == 1
    (latest,) = await summary_memories(api, auth)
    assert latest["text"] == session_summary(admin, sid)[0] != summary
    assert latest["message_id"] > covers_until
    # The transcript expires; its summary stays, and recall finds it.
    admin.execute(
        "update public.chat_sessions set expires_at = now() - interval '1 minute' where id = %s",
        (uuid.UUID(sid),),
    )
    Cleanup(cleanup_url, batch_size=1000, pause_factor=0).run()
    (durable,) = await summary_memories(api, auth)
    assert durable["id"] == latest["id"]
    # (Any similarity: the fake model's summary echoes a long prompt.)
    searching = ApiClient(summary_settings.model_copy(update={"memory_recall_min_score": 0.0}))
    try:
        found = await searching.get("/memory/search", params={"q": "a3 more"}, headers=auth)
    finally:
        await searching.aclose()
    assert found.status_code == 200, found.text
    hits = found.json()["hits"]
    assert [(h["kind"], h["memory_id"]) for h in hits][:1] == [("memory", latest["id"])]
    assert hits[0]["answer"] == latest["text"] and hits[0]["question"] == ""


async def test_a_forgotten_summary_is_not_written_again(
    api: ApiClient, admin: psycopg.Connection, workers: Callable[..., Summarizer]
) -> None:
    _, auth = api.new_user()
    sid = await long_session(api, auth, 12)
    await workers().run(max_seconds=30)
    (kept,) = await summary_memories(api, auth)
    gone = await api.delete(f"/memories/{kept['id']}", headers=auth)
    assert gone.status_code == 200, gone.text
    # The same summary kept again (the worker's pass repeated): refused.
    admin.execute(
        "insert into memchat.summary_queue (user_id, session_id)"
        " select user_id, id from public.chat_sessions where id = %s",
        (uuid.UUID(sid),),
    )
    worker = workers()
    due = await store.claim_due_summaries(worker.db, limit=10, lease_seconds=60)
    (item,) = [d for d in due if d.session_id == uuid.UUID(sid)]
    summary = session_summary(admin, sid)[0]
    assert not await store.remember_summary(worker.db, item, summary, "m", None)
    # Its summary still stands; only the memory is gone.
    assert summary
    assert await summary_memories(api, auth) == []


async def test_exports_carry_the_summary_and_when_it_was_made(
    api: ApiClient, admin: psycopg.Connection, workers: Callable[..., Summarizer]
) -> None:
    _, auth = api.new_user()
    sid = await long_session(api, auth, 12)
    await workers().run(max_seconds=30)
    summary, _, _, _ = session_summary(admin, sid)
    exported = (await api.get(f"/chat/export/{sid}", headers=auth)).json()["session"]
    assert exported["summary"] == summary and exported["summary_updated_at"]
    everything = (await api.get("/export", headers=auth)).json()
    assert everything["sessions"][0]["summary"] == summary


# ------------------------------------------------------------------ RLS


async def test_the_worker_acts_only_on_what_the_queue_hands_it(
    api: ApiClient, worker_url: str, admin: psycopg.Connection
) -> None:
    """Review finding 2: logged in as `memchat_worker`, one could `set role
    memchat_user` with anyone's claims and read or change any user's
    messages. Now the worker reads and writes a session only through the
    lease of a claimed queue item: nothing of a user with nothing queued."""
    _, auth = api.new_user()
    queued_sid = await long_session(api, auth, 12)
    _, other_auth = api.new_user()
    other_sid = await long_session(api, other_auth, 12, tag="secret")
    admin.execute("delete from memchat.summary_queue where session_id = %s", (other_sid,))
    db = Database(worker_url)
    try:
        for attack in (
            "select set_config('role', 'memchat_user', true)",
            "select summary, title from public.chat_sessions",
            "select message from public.chat_message_history",
            "select * from memchat.summary_queue",
        ):
            with pytest.raises(DatabasePermissionDenied):
                async with db.pipeline(None) as conn:
                    await conn.execute(attack)
        forged = store.DueSummary(uuid.uuid4(), uuid.UUID(other_sid), 0)
        assert await store.summary_source(db, forged, window=WINDOW, chunk=50) is None
        fake = store.SummarySource(forged.lease, None, None, [], boundary=1)
        assert await store.save_summary(db, fake, "overwritten") is False

        (item,) = await store.claim_due_summaries(db, limit=10, lease_seconds=60)
        assert item.session_id == uuid.UUID(queued_sid)
        source = await store.summary_source(db, item, window=WINDOW, chunk=50)
        assert source is not None and all("secret" not in m.text for m in source.messages)
        await store.summary_done(db, item, due_after=10_000)
        # The lease ends with the pass: it opens nothing any more.
        assert await store.summary_source(db, item, window=WINDOW, chunk=50) is None
    finally:
        await db.close()
    assert session_summary(admin, other_sid)[0] is None


async def test_a_worker_with_little_time_left_starts_no_round(
    api: ApiClient, workers: Callable[..., Summarizer]
) -> None:
    """In Lambda a round must end before the timeout: with less time left than
    one model call may take, nothing is claimed (the next run takes it)."""
    _, auth = api.new_user()
    await long_session(api, auth, 12)
    worker = workers()
    call_ms = int(worker.settings.openai_timeout_seconds * 1000)
    starved = await worker.run(remaining_ms=lambda: call_ms + 5000 - 1)
    assert (starved.rounds, starved.summarized) == (0, 0)
    assert (await worker.run(remaining_ms=lambda: 120_000)).summarized == 1
