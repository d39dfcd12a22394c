"""Recall as issue 22 made it, seen through GET /memory/search and chat turns:
meaning and words fused (the words of a message's whole round), fact keys
for messages that say several things (added by the backfill, off the
turn's path), a time expression's period favoured, and the search
endpoint's own contract (validation, RLS, throttle, Server-Timing).

The fake model's embeddings are bags of hashed words
(memchat.model.embeddings.local_embedding): two texts are near when they
share words, which the cases below lean on.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from memchat import bootstrap
from memchat.usecases.backfill import Embedder
from tests.conftest import make_settings
from tests.utils.api import ApiClient
from tests.utils.chat_api import chat
from tests.utils.fake_openai import FakeOpenAI

LONG = (
    "I'm planning a trip to Miami and want cheap flights from Boston."
    " By the way, I got my engagement ring resized at Tiffany last week."
)


@pytest.fixture(autouse=True)
def empty_queue(admin: psycopg.Connection) -> None:
    admin.execute("delete from memchat.embedding_queue")


@pytest.fixture
async def embedder(worker_url: str, model: FakeOpenAI) -> AsyncIterator[Embedder]:
    made = bootstrap.embedder(make_settings(worker_url, model.url, job="summaries"))
    yield made
    await made.close()


async def import_sessions(api: ApiClient, auth: dict[str, str], *sessions: Any) -> list[str]:
    """Sessions in the plain shape: each a list of (role, content, created_at)."""
    body = {
        "sessions": [
            {
                "messages": [
                    {"role": role, "content": content, "created_at": at.isoformat()}
                    for role, content, at in session
                ]
            }
            for session in sessions
        ]
    }
    response = await api.post("/sessions/import", json=body, headers=auth)
    assert response.status_code == 200, response.text
    return [s["session_id"] for s in response.json()["sessions"]]


async def search(api: ApiClient, auth: dict[str, str], q: str, **params: Any) -> Any:
    response = await api.get("/memory/search", params={"q": q, **params}, headers=auth)
    assert response.status_code == 200, response.text
    return response


def at(days_ago: float, now: datetime | None = None) -> datetime:
    return (now or datetime.now(UTC)) - timedelta(days=days_ago)


async def test_search_finds_a_round_by_a_word_of_its_answer(
    custom_api: Callable[..., ApiClient], embedder: Embedder
) -> None:
    # No floor: the word alone must find it (its meaning is far from the query).
    api = custom_api(memory_recall_min_score=-1)
    _, auth = api.new_user()
    noise = [
        [("user", f"tell me about topic {i} please", at(3)), ("assistant", "ok", at(3))]
        for i in range(6)
    ]
    target = [
        ("user", "which lens should I buy", at(5)),
        ("assistant", "the Sigma zoomlens suits your Sony body", at(5)),
    ]
    ids = await import_sessions(api, auth, *noise, target)
    await embedder.run()

    body = (await search(api, auth, "zoomlens", k=1)).json()
    # No user message holds the word; the answer of the target's round does.
    assert [h["session_id"] for h in body["hits"]] == [ids[-1]]
    assert body["hits"][0]["answer"] == "the Sigma zoomlens suits your Sony body"
    assert body["hits"][0]["before"] is None  # it opens its session
    assert body["hits"][0]["after"] is None  # and ends it


async def test_a_hit_brings_the_exchanges_around_it(api: ApiClient, embedder: Embedder) -> None:
    _, auth = api.new_user()
    await import_sessions(
        api,
        auth,
        [
            ("user", "I adopted a puppy named Rex", at(2)),
            ("assistant", "Congratulations!", at(2)),
            ("user", "what should a young dog eat", at(2)),
            ("assistant", "puppy food", at(2)),
            ("user", "thanks, and how often?", at(2)),
            ("assistant", "three times a day", at(2)),
            ("user", "one more thing", at(2)),
        ],
    )
    await embedder.run()
    (hit,) = (await search(api, auth, "what should a young dog eat", k=1)).json()["hits"]
    assert hit["question"] == "what should a young dog eat"
    assert hit["before"]["question"] == "I adopted a puppy named Rex"
    assert hit["before"]["answer"] == "Congratulations!"
    # The next exchange only: not the one after that.
    assert hit["after"]["question"] == "thanks, and how often?"
    assert hit["after"]["answer"] == "three times a day"


async def test_a_word_match_outranks_every_match_by_meaning_alone(
    custom_api: Callable[..., ApiClient], embedder: Embedder, model: FakeOpenAI
) -> None:
    """Fusion: the one round holding the word is in both lists, so it comes
    first (1/(20+r) + 1/21 > 1/21). Every embedding here is the same vector,
    so every message is as near to "zoomlens" as any other, and by meaning
    alone the newer message wins the tie and the target, imported first (in
    a request of its own: one import stores its sessions in the order of
    their ids, not the file's), comes last: without the word list another
    session is first. Fewer messages than the meaning list's depth (20 for
    k=1), so the target is in it."""
    target = [("user", "which camera should I buy", at(5)), ("assistant", "the zoomlens", at(5))]
    noise = [[("user", f"tell me about subject {i} please", at(3))] for i in range(10)]
    dimensions = custom_api().settings.embedding_dimensions
    model.script_embeddings(*[{"vector": [0.1] * dimensions}] * 20)
    for words in (True, False):
        api = custom_api(memory_recall_min_score=-1, memory_recall_words=words)
        _, auth = api.new_user()
        ids = await import_sessions(api, auth, target)
        await import_sessions(api, auth, *noise)
        await embedder.run()
        hits = (await search(api, auth, "zoomlens", k=1)).json()["hits"]
        assert ([h["session_id"] for h in hits] == [ids[0]]) is words, words


@pytest.mark.parametrize(
    "query",
    ["zoomlens-related advice", "pizza -zoomlens", '"Sony zoomlens"', "zoomlens or not"],
    ids=["hyphen", "minus", "quotes", "or"],
)
async def test_a_messages_words_are_plain_words_not_search_syntax(
    custom_api: Callable[..., ApiClient], embedder: Embedder, query: str
) -> None:
    """A chat message is not a web search (supabase/schemas/functions/words.sql): a
    hyphenated word is found by its parts too, a minus is punctuation and no
    exclusion, quotes are no phrase. Set up as the test above: by meaning
    alone the target comes last, so only its word can bring it first. Read
    as web search syntax, "zoomlens-related" was a phrase no round holds,
    "-zoomlens" matched every round but the target, and "Sony zoomlens" in
    quotes missed "... zoomlens suits your Sony body"."""
    api = custom_api(memory_recall_min_score=-1)
    _, auth = api.new_user()
    target = [
        ("user", "which camera should I buy", at(5)),
        ("assistant", "the Sigma zoomlens suits your Sony body", at(5)),
    ]
    (target_id,) = await import_sessions(api, auth, target)
    await import_sessions(
        api, auth, *[[("user", f"tell me about subject {i} please", at(3))] for i in range(10)]
    )
    await embedder.run()
    hits = (await search(api, auth, query, k=1)).json()["hits"]
    assert [h["session_id"] for h in hits] == [target_id]


async def test_the_floor_holds_for_word_matches_too(
    custom_api: Callable[..., ApiClient], embedder: Embedder
) -> None:
    api = custom_api(memory_recall_min_score=0.5)
    _, auth = api.new_user()
    # Its nearest key, the answer, is far below the floor: one word of many.
    answer = "I would go for the zoomlens since it covers portraits landscapes and street scenes"
    await import_sessions(
        api, auth, [("user", "which lens should I buy", at(5)), ("assistant", answer, at(5))]
    )
    await embedder.run()
    assert (await search(api, auth, "zoomlens")).json()["hits"] == []


async def test_a_sentence_inside_a_long_message_finds_it_through_its_fact_key(
    custom_api: Callable[..., ApiClient], embedder: Embedder, admin: psycopg.Connection
) -> None:
    # Words off: only keys by meaning can find it.
    api = custom_api(memory_recall_words=False, memory_recall_min_score=0.6)
    user_id, auth = api.new_user()
    (session,) = await import_sessions(
        api, auth, [("user", LONG, at(2)), ("assistant", "Noted.", at(2))]
    )
    await embedder.run()

    keys = admin.execute(
        "select ordinal, model from memchat.message_facts where user_id = %s order by ordinal",
        (user_id,),
    ).fetchall()
    assert keys == [(0, "text-embedding-3-small"), (1, "text-embedding-3-small")]
    # The whole message is too far from the question; its second sentence is not.
    hits = (
        await search(api, auth, "I got my engagement ring resized at Tiffany last week")
    ).json()["hits"]
    assert [h["session_id"] for h in hits] == [session]
    assert hits[0]["question"] == LONG and hits[0]["score"] > 0.9


async def test_a_turns_message_gets_its_fact_keys_from_the_worker_later(
    api: ApiClient, embedder: Embedder, admin: psycopg.Connection
) -> None:
    user_id, auth = api.new_user()
    await chat(api, auth, LONG)
    # The turn stored the message's embedding; its fact keys wait, queued.
    row = admin.execute(
        "select e.facts_model, exists (select 1 from memchat.embedding_queue q"
        "  where q.session_id = e.session_id and q.user_id = e.user_id)"
        " from memchat.message_embeddings e where e.user_id = %s",
        (user_id,),
    ).fetchone()
    assert row == (None, True)
    caller_pending = await api.get("/sessions/import/status", headers=auth)
    # Its fact keys, and the answer's embedding.
    assert caller_pending.json()["embeddings_pending"] == 2

    run = await embedder.run()

    assert run.embedded == 1  # the answer's; the question's was the turn's
    facts = admin.execute(
        "select count(*) from memchat.message_facts where user_id = %s", (user_id,)
    ).fetchone()
    assert facts == (2,)
    status = await api.get("/sessions/import/status", headers=auth)
    assert status.json()["embeddings_pending"] == 0


async def test_making_a_messages_fact_keys_leaves_its_embedding_row_as_it_was(
    api: ApiClient, embedder: Embedder, admin: psycopg.Connection
) -> None:
    """The keys are marked made in memchat.message_facts_made: the message's
    embedding row (its vector and lexemes, 3-4 KB) is not written again, so
    no second version of it reaches the table's indexes (migration
    supabase/schemas/functions/embeddings.sql)."""
    user_id, auth = api.new_user()
    await chat(api, auth, LONG)
    version = (
        "select e.ctid::text, e.xmin::text, e.facts_model from memchat.message_embeddings e"
        " where e.user_id = %s"
    )
    before = admin.execute(version, (user_id,)).fetchone()
    assert before is not None and before[2] is None  # its fact keys are due

    await embedder.run()

    assert admin.execute(version, (user_id,)).fetchone() == before
    made = admin.execute(
        "select m.model = e.model, m.user_id = e.user_id from memchat.message_facts_made m"
        " join memchat.message_embeddings e on e.message_id = m.message_id and e.user_id = %s"
        " where m.user_id = %s",
        (user_id, user_id),
    ).fetchall()
    assert made == [(True, True)]
    # Made: nothing is due for the message any more.
    sessions = admin.execute(
        "select array_agg(s.id) from public.chat_sessions s where s.user_id = %s", (user_id,)
    ).fetchone()
    assert sessions is not None
    due = admin.execute(
        "select count(*) from unnest(%s::uuid[]) s(id),"
        " memchat.unembedded_messages(%s, s.id, null) u",
        (sessions[0], user_id),
    ).fetchone()
    assert due == (0,)
    # The marker goes with its message, as the keys do.
    assert (await api.delete("/me", headers=auth)).status_code == 200
    markers = "select count(*) from memchat.message_facts_made where user_id = %s"
    assert admin.execute(markers, (user_id,)).fetchone() == (0,)


async def test_a_message_saying_one_thing_gets_no_fact_keys_but_a_memory(
    api: ApiClient, admin: psycopg.Connection, embedder: Embedder
) -> None:
    user_id, auth = api.new_user()
    await chat(api, auth, "my favourite colour is teal")
    row = admin.execute(
        "select e.facts_model, (select count(*) from memchat.embedding_queue q"
        "  where q.user_id = e.user_id) from memchat.message_embeddings e where e.user_id = %s",
        (user_id,),
    ).fetchone()
    # Its session is queued: the answer's embedding, its memory.
    assert row == (None, 1)
    await embedder.run()
    counts = admin.execute(
        "select (select count(*) from memchat.message_facts where user_id = %(u)s),"
        " (select count(*) from memchat.message_facts_made where user_id = %(u)s),"
        " (select array_agg(kind order by kind) from memchat.memories where user_id = %(u)s)",
        {"u": user_id},
    ).fetchone()
    # The fake model's answer echoes it, so the assistant "said" it too.
    assert counts == (0, 1, ["assistant", "fact"])


async def test_a_time_expression_favours_its_period(
    custom_api: Callable[..., ApiClient], embedder: Embedder
) -> None:
    # k=1 and words off: only the period can lift the older, weaker match.
    now = datetime(2024, 5, 30, 12, tzinfo=UTC)
    sessions = [
        [("user", "what about my dog and his food", at(1, now))],
        [("user", "my dog barked", at(40, now))],
    ]
    for recall_time, expected in ((True, 1), (False, 0)):
        api = custom_api(memory_recall_words=False, memory_recall_time=recall_time)
        _, auth = api.new_user()
        ids = await import_sessions(api, auth, *sessions)
        await embedder.run()
        hits = (
            await search(api, auth, "what about my dog in April?", k=1, as_of=now.isoformat())
        ).json()["hits"]
        assert [h["session_id"] for h in hits] == [ids[expected]], recall_time


async def test_as_of_is_the_moment_time_expressions_are_read_against(
    custom_api: Callable[..., ApiClient], embedder: Embedder
) -> None:
    api = custom_api(memory_recall_words=False)
    _, auth = api.new_user()
    now = datetime(2024, 5, 30, 12, tzinfo=UTC)
    ids = await import_sessions(
        api,
        auth,
        [("user", "we talked about my dog and his food", at(1, now))],
        [("user", "my dog chewed a shoe", at(40, now))],
    )
    await embedder.run()
    q = "my dog yesterday?"
    first = (await search(api, auth, q, k=1, as_of=now.isoformat())).json()["hits"]
    later = now - timedelta(days=39)
    second = (await search(api, auth, q, k=1, as_of=later.isoformat())).json()["hits"]
    assert [h["session_id"] for h in first] == [ids[0]]
    assert [h["session_id"] for h in second] == [ids[1]]


async def test_search_sees_only_the_callers_memory_and_says_its_time(api: ApiClient) -> None:
    _, alice = api.new_user()
    _, bob = api.new_user()
    await chat(api, alice, "my favourite colour is teal")
    response = await search(api, bob, "favourite colour teal")
    assert response.json()["hits"] == []
    response = await search(api, alice, "favourite colour teal")
    body = response.json()
    assert [h["question"] for h in body["hits"]] == ["my favourite colour is teal"]
    timing = response.headers["server-timing"]
    parts = dict(part.strip().split(";dur=") for part in timing.split(","))
    assert list(parts) == ["recall", "embedding"]
    assert all(float(ms) >= 0 for ms in parts.values())
    assert body["recall_ms"] >= 0 and body["agent_name"] == "default"


async def test_search_includes_the_active_sessions_window(api: ApiClient) -> None:
    _, auth = api.new_user()
    await chat(api, auth, "my favourite colour is teal")
    hits = (await search(api, auth, "favourite colour teal")).json()["hits"]
    assert len(hits) == 1  # a turn would not recall it: it is in its window


@pytest.mark.parametrize(
    ("params", "status", "code"),
    [
        ({"q": "x", "as_of": "2024-05-30T12:00:00"}, 400, "invalid_as_of"),
        ({"q": "   "}, 400, "bad_request"),
        ({"q": "x", "k": 0}, 422, "validation_error"),
        ({"q": "x", "k": 51}, 422, "validation_error"),
        ({"q": "x", "as_of": "yesterday"}, 400, "invalid_as_of"),
        ({"q": "x", "as_of": "1700000000"}, 400, "invalid_as_of"),
        ({}, 422, "validation_error"),
        ({"q": "x", "agent_name": "bad name!"}, 422, "validation_error"),
    ],
)
async def test_bad_searches_are_4xx_with_the_error_json(
    api: ApiClient, params: dict[str, Any], status: int, code: str
) -> None:
    _, auth = api.new_user()
    response = await api.get("/memory/search", params=params, headers=auth)
    assert response.status_code == status
    assert response.json()["error"] == code


@pytest.mark.parametrize(
    ("as_of", "q"),
    [
        ("0001-01-01T00:00:00Z", "what did I buy last year?"),
        ("0001-01-01T00:00:00Z", "what did I eat yesterday"),
        ("0001-01-01T00:00:00Z", "what did I read last week"),
        ("0001-01-01T00:00:00Z", "back in March"),
        ("0001-01-01T00:00:00+05:00", "what did I say today"),
        ("9999-12-31T00:00:00Z", "what did I eat today"),
        ("9999-12-31T00:00:00Z", "what happened this year"),
        ("9999-12-31T00:00:00Z", "what happened this month"),
        ("9999-12-31T00:00:00Z", "what did I do recently"),
        ("9999-12-31T23:59:59-05:00", "what did I do after last week"),
    ],
)
async def test_as_of_at_the_calendars_ends_is_answered(api: ApiClient, as_of: str, q: str) -> None:
    # The period is cut at the calendar's ends (or there is none): never a 500.
    _, auth = api.new_user()
    await chat(api, auth, "my favourite colour is teal")
    response = await api.get("/memory/search", params={"q": q, "as_of": as_of}, headers=auth)
    assert response.status_code == 200, response.text
    assert isinstance(response.json()["hits"], list)


@pytest.mark.parametrize("q", ["\x00", "teal\x00colour", "\x00 last week"])
async def test_a_nul_in_q_is_422_naming_q(api: ApiClient, q: str) -> None:
    _, auth = api.new_user()
    response = await api.get("/memory/search", params={"q": q}, headers=auth)
    assert response.status_code == 422, response.text
    body = response.json()
    assert body["error"] == "validation_error"
    assert body["detail"] == "q: must not contain NUL (U+0000) characters."


async def test_search_needs_a_token(api: ApiClient) -> None:
    response = await api.get("/memory/search", params={"q": "x"})
    assert response.status_code == 401


async def test_search_takes_a_read_token(custom_api: Callable[..., ApiClient]) -> None:
    api = custom_api(read_rate_per_minute=1, read_rate_burst=1)
    _, auth = api.new_user()
    assert (await api.get("/memory/search", params={"q": "x"}, headers=auth)).status_code == 200
    refused = await api.get("/memory/search", params={"q": "x"}, headers=auth)
    assert refused.status_code == 429 and refused.json()["error"] == "rate_limited"


async def test_memory_off_is_409(custom_api: Callable[..., ApiClient]) -> None:
    api = custom_api(memory_enabled=False)
    _, auth = api.new_user()
    response = await api.get("/memory/search", params={"q": "x"}, headers=auth)
    assert response.status_code == 409
    assert response.json()["error"] == "recall_disabled"


async def test_an_embeddings_outage_is_503(
    custom_api: Callable[..., ApiClient], model: FakeOpenAI
) -> None:
    api = custom_api(embedding_timeout_seconds=0.5)
    _, auth = api.new_user()
    model.script_embeddings({"status": 500, "error": "down"})
    response = await api.get("/memory/search", params={"q": "x"}, headers=auth)
    assert response.status_code == 503
    assert response.json()["error"] == "recall_unavailable"


async def test_deleting_a_session_takes_its_fact_keys(
    api: ApiClient, embedder: Embedder, admin: psycopg.Connection
) -> None:
    user_id, auth = api.new_user()
    (session,) = await import_sessions(api, auth, [("user", LONG, at(1))])
    await embedder.run()
    count = "select count(*) from memchat.message_facts where user_id = %s"
    assert admin.execute(count, (user_id,)).fetchone() == (2,)
    deleted = await api.delete("/me", headers=auth)
    assert deleted.status_code == 200, deleted.text
    assert admin.execute(count, (user_id,)).fetchone() == (0,)
    assert uuid.UUID(session)


async def test_fact_keys_can_be_turned_off(
    api: ApiClient, worker_url: str, model: FakeOpenAI, admin: psycopg.Connection
) -> None:
    off = bootstrap.embedder(
        make_settings(worker_url, model.url, job="summaries", memory_recall_facts=False)
    )
    try:
        user_id, auth = api.new_user()
        await import_sessions(api, auth, [("user", LONG, at(1))])
        run = await off.run()
    finally:
        await off.close()
    assert run.embedded == 1 and run.finished
    row = admin.execute(
        "select (select count(*) from memchat.message_facts f where f.user_id = e.user_id),"
        " (select m.model = e.model from memchat.message_facts_made m"
        "   where m.message_id = e.message_id and m.user_id = e.user_id)"
        " from memchat.message_embeddings e where e.user_id = %s",
        (user_id,),
    ).fetchone()
    assert row == (0, True)  # done, with no keys: nothing stays queued
    status = await api.get("/sessions/import/status", headers=auth)
    assert status.json()["embeddings_pending"] == 0
