"""Durable memory (memchat.memories) through the API: what the backfill
keeps of each side's messages, GET /memories (a page at a time, searched
with q) and DELETE /memories/{id}, memory outliving its transcript through
the TTL cleanup (MEMORY_RETENTION_DAYS) and recall finding it then, and
memory going with its user.

The fake model's embeddings are bags of hashed words
(memchat.model.embeddings.local_embedding): two texts are near when they
share words.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from memchat.usecases.backfill import Embedder, remember_stored
from memchat.usecases.cleanup import Cleanup
from tests.api import test_memory_search as search_tests
from tests.utils.api import ApiClient
from tests.utils.chat_api import chat
from tests.utils.fake_openai import FakeOpenAI, tool_call
from tests.utils.store_data import acting_as
from tests.utils.users import claims_for

DAY = datetime(2024, 3, 1, 12, tzinfo=UTC)
empty_queue = search_tests.empty_queue
embedder = search_tests.embedder
import_sessions, search = search_tests.import_sessions, search_tests.search

# Messages of one sentence in which the speaker speaks of themselves: a memory each.
MOVED = "I moved to Berlin in March for a new job."
MUSEUM = "I would start with the Pergamon museum on a rainy day."
WEATHER = "The weather there is grey most days."
UMBRELLA = "I bought a yellow umbrella for it."


def at(minutes: int) -> datetime:
    return DAY + timedelta(minutes=minutes)


async def memories(api: ApiClient, auth: dict[str, str], **params: Any) -> dict[str, Any]:
    response = await api.get("/memories", params=params, headers=auth)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def berlin(api: ApiClient, auth: dict[str, str], embedder: Embedder) -> str:
    """A session where the user moved to Berlin and the assistant suggests a
    museum, embedded; returns its id."""
    (session_id,) = await import_sessions(
        api,
        auth,
        [
            ("user", MOVED, at(0)),
            ("assistant", MUSEUM, at(1)),
        ],
    )
    await embedder.run()
    return session_id


# A session's id is its user's (an imported session's is made of what it holds:
# every user of these tests has the same ones), so both are named.
def expire(admin: psycopg.Connection, user_id: uuid.UUID, session_id: str) -> None:
    admin.execute(
        "update public.chat_sessions set expires_at = now() - interval '1 minute'"
        " where id = %s and user_id = %s",
        (uuid.UUID(session_id), user_id),
    )


def expiry_of(admin: psycopg.Connection, user_id: uuid.UUID, session_id: str) -> datetime:
    (expires_at,) = admin.execute(
        "select expires_at from public.chat_sessions where id = %s and user_id = %s",
        (uuid.UUID(session_id), user_id),
    ).fetchone() or (None,)
    assert expires_at is not None
    return expires_at  # type: ignore[no-any-return]


def stored(admin: psycopg.Connection, user_id: uuid.UUID) -> int:
    (count,) = admin.execute(
        "select count(*) from memchat.memories where user_id = %s", (user_id,)
    ).fetchone() or (0,)
    return int(count)


async def test_the_backfill_keeps_what_each_side_said_of_themselves(
    api: ApiClient, admin: psycopg.Connection, embedder: Embedder
) -> None:
    user_id, auth = api.new_user()
    session_id = await berlin(api, auth, embedder)
    # A message that says nothing of its speaker is not kept; one that says
    # more than that: its sentence, then the whole message (400 characters at most).
    await import_sessions(api, auth, [("user", WEATHER, at(5))])
    await import_sessions(api, auth, [("user", f"{WEATHER} {UMBRELLA}", at(6))])
    await embedder.run()
    body = await memories(api, auth)
    assert body["next_cursor"] is None
    # Newest first (a message's later ones first).
    assert [(m["kind"], m["text"]) for m in body["memories"]] == [
        ("fact", f"{WEATHER} {UMBRELLA}"),
        ("fact", UMBRELLA),
        ("assistant", MUSEUM),
        ("fact", MOVED),
    ]
    fact = body["memories"][3]
    assert fact["session_id"] == session_id and fact["agent_name"] == "default"
    assert fact["created_at"].startswith("2024-03-01T12:00:00")
    # While the session lives, a memory expires a year after it does.
    expected = expiry_of(admin, user_id, session_id) + timedelta(days=365)
    assert datetime.fromisoformat(fact["expires_at"]) == expected
    # The backfill runs again (a new model, say): nothing is written twice.
    admin.execute(
        "update memchat.message_embeddings set model = 'older-model'"
        " where session_id = %s and user_id = %s",
        (uuid.UUID(session_id), user_id),
    )
    admin.execute("select memchat.queue_embeddings(array[%s]::uuid[])", (uuid.UUID(session_id),))
    await embedder.run()
    assert len((await memories(api, auth))["memories"]) == 4


async def test_a_turns_messages_are_kept_once_the_backfill_has_run(
    api: ApiClient, embedder: Embedder, model: FakeOpenAI
) -> None:
    _, auth = api.new_user()
    model.script({"content": "I am glad you found a flat near the park."})
    await chat(api, auth, "I finally found a flat near Tempelhof park.")
    assert (await memories(api, auth))["memories"] == []
    await embedder.run()
    kept = [(m["kind"], m["text"]) for m in (await memories(api, auth))["memories"]]
    assert kept == [
        ("assistant", "I am glad you found a flat near the park."),
        ("fact", "I finally found a flat near Tempelhof park."),
    ]


async def test_the_listing_pages_filters_by_agent_and_searches(
    api: ApiClient, embedder: Embedder
) -> None:
    _, auth = api.new_user()
    await berlin(api, auth, embedder)
    await import_sessions(api, auth, [("user", "I adopted a grey cat called Miso.", at(90))])
    said = {
        "role": "user",
        "content": "I run five kilometres daily.",
        "created_at": at(99).isoformat(),
    }
    response = await api.post(
        "/sessions/import",
        json={"sessions": [{"agent_name": "coach", "messages": [said]}]},
        headers=auth,
    )
    assert response.status_code == 200, response.text
    await embedder.run()
    first = await memories(api, auth, limit=2)
    assert len(first["memories"]) == 2 and first["next_cursor"]
    rest = await memories(api, auth, limit=2, cursor=first["next_cursor"])
    texts = [m["text"] for m in first["memories"] + rest["memories"]]
    assert len(texts) == 4 == len(set(texts)) and rest["next_cursor"] is None
    # The latest stated first.
    stated = [m["created_at"] for m in first["memories"] + rest["memories"]]
    assert stated == sorted(stated, reverse=True)
    assert texts[0] == "I run five kilometres daily."
    coach = await memories(api, auth, agent_name="coach")
    assert [m["text"] for m in coach["memories"]] == ["I run five kilometres daily."]
    # q: recall's search over the memories, best first, with a score.
    found = await memories(api, auth, q="where did I move to, Berlin?")
    assert found["memories"][0]["text"] == MOVED
    assert found["memories"][0]["score"] > 0.3 and found["next_cursor"] is None
    for params, code in (
        ({"cursor": "not-a-cursor"}, 400),
        ({"q": "   "}, 400),
        ({"q": "cat", "cursor": first["next_cursor"]}, 400),
        ({"limit": 0}, 422),
        ({"agent_name": "no spaces"}, 422),
    ):
        response = await api.get("/memories", params=params, headers=auth)
        assert response.status_code == code, (params, response.text)
        assert "error" in response.json()


async def test_a_deleted_memory_is_gone_for_good_and_only_its_owner_may_delete_it(
    api: ApiClient, admin: psycopg.Connection, embedder: Embedder
) -> None:
    user_id, auth = api.new_user()
    _, other = api.new_user()
    session_id = await berlin(api, auth, embedder)
    fact = next(m for m in (await memories(api, auth))["memories"] if m["kind"] == "fact")
    # Another user sees none of them and cannot delete one.
    assert (await memories(api, other))["memories"] == []
    refused = await api.delete(f"/memories/{fact['id']}", headers=other)
    assert refused.status_code == 404
    assert refused.json()["error"] == "memory_not_found"
    gone = await api.delete(f"/memories/{fact['id']}", headers=auth)
    assert gone.status_code == 200 and gone.json() == {"deleted": 1}
    again = await api.delete(f"/memories/{fact['id']}", headers=auth)
    assert again.status_code == 404
    assert (await api.delete("/memories/0", headers=auth)).status_code == 422
    # The backfill reading the message again does not bring it back.
    admin.execute(
        "update memchat.message_embeddings set model = 'older-model'"
        " where session_id = %s and user_id = %s",
        (uuid.UUID(session_id), user_id),
    )
    admin.execute("select memchat.queue_embeddings(array[%s]::uuid[])", (uuid.UUID(session_id),))
    await embedder.run()
    assert [m["text"] for m in (await memories(api, auth))["memories"]] == [MUSEUM]


async def test_deleting_a_sentence_takes_its_whole_message_and_the_reverse(
    api: ApiClient, admin: psycopg.Connection, embedder: Embedder
) -> None:
    """A short message's sentence and the message whole are two memories:
    deleting either deletes the other, so neither keeps what the user
    removed, and the backfill makes neither again."""
    user_id, auth = api.new_user()
    (first,) = await import_sessions(api, auth, [("user", f"{WEATHER} {UMBRELLA}", at(0))])
    (second,) = await import_sessions(api, auth, [("user", f"{WEATHER} {MOVED}", at(5))])
    await embedder.run()
    listed = (await memories(api, auth))["memories"]
    assert [m["text"] for m in listed] == [
        f"{WEATHER} {MOVED}",
        MOVED,
        f"{WEATHER} {UMBRELLA}",
        UMBRELLA,
    ]
    umbrella = next(m for m in listed if m["text"] == UMBRELLA)
    whole = next(m for m in listed if m["text"] == f"{WEATHER} {MOVED}")
    for memory in (umbrella, whole):
        gone = await api.delete(f"/memories/{memory['id']}", headers=auth)
        assert gone.status_code == 200 and gone.json() == {"deleted": 1}
    assert (await memories(api, auth))["memories"] == []
    # Read again (a new model): neither comes back.
    for session_id in (first, second):
        admin.execute(
            "update memchat.message_embeddings set model = 'older-model'"
            " where session_id = %s and user_id = %s",
            (uuid.UUID(session_id), user_id),
        )
        admin.execute(
            "select memchat.queue_embeddings(array[%s]::uuid[])", (uuid.UUID(session_id),)
        )
    await embedder.run()
    assert (await memories(api, auth))["memories"] == []


async def test_memory_outlives_the_transcript_and_recall_finds_it(
    custom_api: Callable[..., ApiClient],
    admin: psycopg.Connection,
    embedder: Embedder,
    cleanup_url: str,
    model: FakeOpenAI,
) -> None:
    api = custom_api(memory_recall_min_score=0.2)
    user_id, auth = api.new_user()
    session_id = await berlin(api, auth, embedder)
    # While the session lives, recall finds its exchange, never its memories.
    live = (await search(api, auth, "when did I move to Berlin?")).json()["hits"]
    assert live and {h["kind"] for h in live} == {"exchange"}
    ends = expiry_of(admin, user_id, session_id)
    expire(admin, user_id, session_id)
    result = Cleanup(cleanup_url, batch_size=1000, pause_factor=0).run()
    assert result.deleted_sessions >= 1 and result.finished
    sessions = (await api.get("/sessions", headers=auth)).json()["sessions"]
    assert sessions == []
    kept = (await memories(api, auth))["memories"]
    assert [m["text"] for m in kept] == [MUSEUM, MOVED]
    # A year past the session's expiry (the one the cleanup found passed).
    expires = datetime.fromisoformat(kept[0]["expires_at"])
    assert expires - timedelta(days=365) < ends
    assert expires > datetime.now(UTC) + timedelta(days=364)
    # Recall finds a memory, says it is one, and a turn's prompt shows it.
    hits = (await search(api, auth, "when did I move to Berlin?")).json()["hits"]
    assert hits[0]["kind"] == "memory" and hits[0]["question"] == MOVED
    assert hits[0]["memory_id"] == kept[1]["id"] and hits[0]["answer"] is None
    assert hits[0]["created_at"].startswith("2024-03-01T12:00:00")
    model.script({"content": "You moved in March."})
    body = await chat(api, auth, "when did I move to Berlin?")
    assert body["memory"]["recalled"][0]["message_id"] == kept[1]["message_id"]
    prompt = "\n".join(str(m.get("content")) for m in model.requests[-1]["messages"])
    assert "remembered" in prompt and MOVED in prompt
    # Past its retention, the cleanup deletes it.
    admin.execute(
        "update memchat.memories set expires_at = now() - interval '1 minute'"
        " where user_id = %s and session_id = %s",
        (user_id, uuid.UUID(session_id)),
    )
    result = Cleanup(cleanup_url, batch_size=1, pause_factor=0).run()
    assert result.deleted_memories >= 2
    assert (await memories(api, auth))["memories"] == []


KREUZBERG = "I live in a flat by the canal in Kreuzberg, Berlin."
WEDDING = "I live in a flat in Wedding now, near the park."
MISO = "I keep a grey cat called Miso in Berlin."


async def test_a_newer_memory_about_the_same_thing_ranks_first(
    custom_api: Callable[..., ApiClient],
    admin: psycopg.Connection,
    embedder: Embedder,
    cleanup_url: str,
) -> None:
    api = custom_api(memory_recall_min_score=0.05)
    user_id, auth = api.new_user()
    # The older address matches the question best; the newer one (another
    # session's) updates it; the newest memory, about something else, stays
    # where it ranks.
    ids = await import_sessions(
        api,
        auth,
        [("user", KREUZBERG, at(0))],
        [("user", WEDDING, at(60 * 24 * 30))],
        [("user", MISO, at(60 * 24 * 60))],
    )
    await embedder.run()
    # Asked about the past, or with no word of time, the best match first.
    found = (await memories(api, auth, q="Which part of Berlin do I live in?"))["memories"]
    assert found[0]["text"] == KREUZBERG
    # Asked about the present, the update first.
    question = "Which part of Berlin do I currently live in?"
    found = (await memories(api, auth, q=question))["memories"]
    assert [m["text"] for m in found] == [WEDDING, KREUZBERG, MISO]
    # Both addresses stay, each with its date, and keep their own scores.
    assert found[1]["score"] > found[0]["score"]
    assert found[0]["created_at"] > found[1]["created_at"]
    # Recall from memories alone (the transcripts gone) ranks them so too.
    for session_id in ids:
        expire(admin, user_id, session_id)
    assert Cleanup(cleanup_url, batch_size=1000, pause_factor=0).run().finished
    hits = (await search(api, auth, question)).json()["hits"]
    assert [h["question"] for h in hits] == [WEDDING, KREUZBERG, MISO]
    assert {h["kind"] for h in hits} == {"memory"}


async def test_a_rare_word_of_the_question_outweighs_a_common_one(
    api: ApiClient, admin: psycopg.Connection, embedder: Embedder
) -> None:
    """The words' list (memchat.search_memories by words alone: no query
    embedding) weighs each of the question's words by how few of the user's
    memories hold it: the one memory with "Zanzibar" comes before the eight
    with "coffee", though each holds one of the two."""
    user_id, auth = api.new_user()
    zanzibar = "I once flew to Zanzibar in a small plane."
    await import_sessions(api, auth, [("user", zanzibar, at(0))])
    for day in range(1, 9):
        said = f"I drink coffee with oat milk on day {day} of the week."
        await import_sessions(api, auth, [("user", said, at(day * 60))])
    await embedder.run()
    with acting_as(admin, claims_for(user_id)) as conn:
        ids = conn.execute(
            "select array_agg(f.id order by f.ordinality)"
            " from memchat.search_memories('default', null, null, %s, 3, 0, false)"
            " with ordinality f",
            ("coffee Zanzibar",),
        ).fetchone()
        assert ids is not None
        found = conn.execute(
            "select m.text from unnest(%s::bigint[]) with ordinality f(id, n)"
            " join memchat.memories m on m.id = f.id and m.user_id = %s order by f.n",
            (ids[0], user_id),
        ).fetchall()
    assert len(found) == 3 and found[0] == (zanzibar,), found


async def test_memories_of_other_sessions_come_before_a_sessions_second(
    api: ApiClient, embedder: Embedder
) -> None:
    """As for recall's exchanges: each hit already taken from a session makes
    its next one worth 0.9 times less, so two sessions that each say
    something come before one saying it twice."""
    _, auth = api.new_user()
    await import_sessions(
        api,
        auth,
        [
            ("user", "I visited the Pergamon museum in Berlin today.", at(0)),
            ("assistant", "I hear the Pergamon museum in Berlin is closed for years.", at(1)),
        ],
    )
    await import_sessions(api, auth, [("user", "I want to see a museum in Berlin.", at(60))])
    await embedder.run()
    found = await memories(api, auth, q="the Pergamon museum in Berlin", limit=2)
    texts = [m["text"] for m in found["memories"]]
    assert len(texts) == 2 and "Pergamon" in texts[0], texts
    assert texts[1] == "I want to see a museum in Berlin.", texts


async def test_with_no_retention_memory_goes_with_its_session(
    api: ApiClient, admin: psycopg.Connection, embedder: Embedder, cleanup_url: str
) -> None:
    user_id, auth = api.new_user()
    session_id = await berlin(api, auth, embedder)
    expire(admin, user_id, session_id)
    result = Cleanup(cleanup_url, batch_size=1000, pause_factor=0, memory_retention_days=0).run()
    assert result.deleted_sessions >= 1 and result.deleted_memories >= 2
    assert stored(admin, user_id) == 0


async def test_a_session_deleted_by_its_user_takes_its_memories(
    api: ApiClient, admin: psycopg.Connection, embedder: Embedder
) -> None:
    user_id, auth = api.new_user()
    session_id = await berlin(api, auth, embedder)
    await import_sessions(api, auth, [("user", "I adopted a grey cat called Miso.", at(90))])
    await embedder.run()
    assert stored(admin, user_id) == 3
    # Not the cleanup (the Data API, say): the session's memories go too.
    admin.execute(
        "delete from public.chat_sessions where id = %s and user_id = %s",
        (uuid.UUID(session_id), user_id),
    )
    assert [m["text"] for m in (await memories(api, auth))["memories"]] == [
        "I adopted a grey cat called Miso."
    ]
    # Clearing a session keeps what memory kept of it.
    (other,) = [s["id"] for s in (await api.get("/sessions", headers=auth)).json()["sessions"]]
    cleared = await api.post("/chat/clear-session", json={"session_id": other}, headers=auth)
    assert cleared.status_code == 200, cleared.text
    assert stored(admin, user_id) == 1
    erased = await api.delete("/me", headers=auth)
    assert erased.status_code == 200 and erased.json()["deleted"]["memories"] == 1
    assert stored(admin, user_id) == 0


async def test_the_account_export_carries_the_memories_in_every_format(
    api: ApiClient, admin: psycopg.Connection, embedder: Embedder, cleanup_url: str
) -> None:
    user_id, auth = api.new_user()
    session_id = await berlin(api, auth, embedder)
    expire(admin, user_id, session_id)
    Cleanup(cleanup_url, batch_size=1000, pause_factor=0).run()  # a memory outlives its session
    await import_sessions(api, auth, [("user", "I adopted a grey cat called Miso.", at(90))])
    await embedder.run()
    body = (await api.get("/export", headers=auth)).json()
    assert [s["id"] for s in body["sessions"]] != [session_id]
    exported = body["memories"]
    assert [(m["kind"], m["text"]) for m in exported] == [
        ("fact", MOVED),
        ("assistant", MUSEUM),
        ("fact", "I adopted a grey cat called Miso."),
    ]
    assert exported[0]["session_id"] == session_id and exported[0]["expires_at"]
    assert exported[2]["expires_at"] is None  # its session lives
    lines = (await api.get("/export?format=ndjson", headers=auth)).text.splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["text"] for r in records if r["type"] == "memory"] == [m["text"] for m in exported]
    markdown = (await api.get("/export?format=markdown", headers=auth)).text
    memories_part = markdown.split("# Memories\n\n", 1)[1]
    assert f"- {MOVED} _(the user, " in memories_part
    assert f"- {MUSEUM} _(the assistant, " in memories_part


async def test_an_account_export_imported_brings_the_memories_of_sessions_gone(
    custom_api: Callable[..., ApiClient],
    admin: psycopg.Connection,
    embedder: Embedder,
    cleanup_url: str,
) -> None:
    api = custom_api(memory_recall_min_score=0.2)
    user_id, auth = api.new_user()
    session_id = await berlin(api, auth, embedder)
    expire(admin, user_id, session_id)
    Cleanup(cleanup_url, batch_size=1000, pause_factor=0).run()
    await import_sessions(api, auth, [("user", "I adopted a grey cat called Miso.", at(90))])
    await embedder.run()
    exported = (await api.get("/export", headers=auth)).json()
    assert len(exported["memories"]) == 3

    # Another account (another deployment's, say) imports the export.
    elsewhere_id, elsewhere = api.new_user()
    response = await api.post("/sessions/import", json=exported, headers=elsewhere)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["imported_memories"] == 2 and body["imported_sessions"] == 1
    kept = (await memories(api, elsewhere))["memories"]
    # The memories of the session gone, as they were; the live session's
    # are made again by the backfill from its messages, not copied.
    assert [(m["kind"], m["text"], m["session_id"]) for m in kept] == [
        ("assistant", MUSEUM, session_id),
        ("fact", MOVED, session_id),
    ]
    given = {m["text"]: m for m in exported["memories"]}
    for memory in kept:
        for field in ("created_at", "expires_at"):
            theirs = datetime.fromisoformat(given[memory["text"]][field])
            assert datetime.fromisoformat(memory[field]) == theirs
    # The backfill embeds them, and recall finds them by meaning.
    (unembedded,) = admin.execute(
        "select count(*) from memchat.memories where user_id = %s and embedding is null",
        (elsewhere_id,),
    ).fetchone() or (None,)
    assert unembedded == 2
    run = await embedder.run()
    assert run.memories == 2
    assert len((await memories(api, elsewhere))["memories"]) == 3
    hits = (await search(api, elsewhere, "when did I move to Berlin?")).json()["hits"]
    assert hits[0]["kind"] == "memory" and hits[0]["question"] == MOVED
    # The same export again: nothing twice.
    again = await api.post("/sessions/import", json=exported, headers=elsewhere)
    assert again.status_code == 200 and again.json()["imported_memories"] == 0
    assert len((await memories(api, elsewhere))["memories"]) == 3
    # A memory that is not one: the error names it.
    bad = {"sessions": [], "memories": [{**exported["memories"][0], "kind": "rumour"}]}
    refused = await api.post("/sessions/import", json=bad, headers=elsewhere)
    assert refused.status_code == 422 and "memories[0].kind" in refused.json()["detail"]


async def test_memories_without_an_embedding_are_embedded_by_the_backfill(
    api: ApiClient, admin: psycopg.Connection, embedder: Embedder
) -> None:
    """After `memchat db reembed --dimensions` (which leaves the memories
    their text, without an embedding), the backfill embeds them again."""
    user_id, auth = api.new_user()
    await berlin(api, auth, embedder)
    admin.execute(
        "update memchat.memories set embedding = null, model = null where user_id = %s",
        (user_id,),
    )
    assert (await embedder.run()).memories >= 2  # and any other user's
    rows = admin.execute(
        "select model, embedding is not null from memchat.memories where user_id = %s",
        (user_id,),
    ).fetchall()
    assert rows and all(model and embedded for model, embedded in rows)


CAT = "I adopted a cat named Miso."
# Past 400 characters: only its sentence in which the user speaks of themselves is kept.
ABOUT_CATS = f"{CAT} " + "Cats sleep for most of the day and hunt at dusk. " * 9


async def test_messages_stored_before_durable_memory_get_their_memories(
    api: ApiClient, admin: psycopg.Connection, embedder: Embedder
) -> None:
    """`memchat db reembed --memories` (remember_stored): the live messages
    and summaries get the memories they lack, as the backfill makes them,
    but none their user forgot; a second run makes none."""
    user_id, auth = api.new_user()
    session_id = await berlin(api, auth, embedder)
    await import_sessions(api, auth, [("user", ABOUT_CATS, at(10))])
    await embedder.run()
    # The session's summary, written before durable memory kept summaries.
    # (A session id is its user's: every user of these tests has this one.)
    admin.execute(
        "update public.chat_sessions set summary = 'Moved to Berlin; likes museums.',"
        " summary_covers_until = (select max(h.id) from public.chat_message_history h"
        "                          where h.session_id = %(s)s and h.user_id = %(u)s)"
        " where id = %(s)s and user_id = %(u)s",
        {"s": uuid.UUID(session_id), "u": user_id},
    )
    museum = next(m for m in (await memories(api, auth))["memories"] if m["text"] == MUSEUM)
    assert (await api.delete(f"/memories/{museum['id']}", headers=auth)).status_code == 200
    # Stored before durable memory: the messages have no memories.
    admin.execute("delete from memchat.memories where user_id = %s", (user_id,))
    name = embedder.model.embedding_model

    assert remember_stored(admin, name) >= 3  # the database's other users' too
    assert stored(admin, user_id) == 3
    kept = [(m["kind"], m["text"]) for m in (await memories(api, auth))["memories"]]
    assert kept == [
        ("fact", CAT),
        ("summary", "Moved to Berlin; likes museums."),
        ("fact", MOVED),
    ]
    summary = (await memories(api, auth))["memories"][1]
    assert summary["created_at"].startswith("2024-03-01T12:01:00")  # its last message's
    # The whole message's memory has its embedding; the others wait for the backfill.
    rows = admin.execute(
        "select m.text, m.embedding::text = e.embedding::text, m.model"
        "  from memchat.memories m left join memchat.message_embeddings e"
        "    on e.message_id = m.message_id and e.user_id = m.user_id"
        " where m.user_id = %s order by m.text",
        (user_id,),
    ).fetchall()
    assert rows == [
        (CAT, None, None),
        (MOVED, True, name),
        ("Moved to Berlin; likes museums.", None, None),
    ]
    assert (await embedder.run()).memories >= 2  # and the other users'
    unembedded = admin.execute(
        "select count(*) from memchat.memories where user_id = %s and embedding is null",
        (user_id,),
    ).fetchone()
    assert unembedded == (0,)
    remember_stored(admin, name)
    assert stored(admin, user_id) == 3
    # A message with some of its memories (kept before the whole message
    # was one): the one it lacks is made, those it has are left.
    await import_sessions(api, auth, [("user", f"{WEATHER} {UMBRELLA}", at(20))])
    await embedder.run()
    admin.execute(
        "delete from memchat.memories where user_id = %s and text = %s",
        (user_id, f"{WEATHER} {UMBRELLA}"),
    )
    assert stored(admin, user_id) == 4
    remember_stored(admin, name)
    kept = [m["text"] for m in (await memories(api, auth))["memories"]]
    assert kept[:2] == [f"{WEATHER} {UMBRELLA}", UMBRELLA] and len(kept) == 5


async def test_the_model_forgets_memories_the_user_asks_it_to_with_the_turn(
    api: ApiClient, admin: psycopg.Connection, embedder: Embedder, model: FakeOpenAI
) -> None:
    user_id, auth = api.new_user()
    await berlin(api, auth, embedder)
    fact = next(m for m in (await memories(api, auth))["memories"] if m["kind"] == "fact")
    # The model finds what the user means, then forgets it by id, then says so.
    model.script(
        tool_call("find_memories", content="Berlin move"),
        tool_call("forget_memories", content=f"{fact['id']}, 999999"),
        tool_call("forget_memories", content=str(fact["id"])),
        {"content": "Done: I forgot that you moved to Berlin."},
    )
    body = await chat(api, auth, "Please forget that I moved to Berlin.")
    assert body["answer"] == "Done: I forgot that you moved to Berlin."
    results = [m["content"] for m in model.requests[-1]["messages"] if m["role"] == "tool"]
    shown = json.loads(results[0])
    assert shown[0] == {
        "id": fact["id"],
        "text": MOVED,
        "time": fact["created_at"],
        "said_by": "user",
    }
    assert results[1] == (
        "error: forget_memories takes ids that find_memories showed in this turn; not shown: 999999"
    )
    assert results[2] == f"forgotten, for good: {json.dumps([MOVED])}"
    assert [m["text"] for m in (await memories(api, auth))["memories"]] == [MUSEUM]
    (marked,) = admin.execute(
        "select count(*) from memchat.forgotten_memories where user_id = %s", (user_id,)
    ).fetchone() or (0,)
    assert marked == 1


async def test_a_turn_that_fails_forgets_nothing(
    api: ApiClient, embedder: Embedder, model: FakeOpenAI
) -> None:
    _, auth = api.new_user()
    await berlin(api, auth, embedder)
    fact = next(m for m in (await memories(api, auth))["memories"] if m["kind"] == "fact")
    model.script(
        tool_call("find_memories", content="Berlin"),
        tool_call("forget_memories", content=str(fact["id"])),
        {"status": 500, "error": "the model broke"},
    )
    response = await api.post(
        "/chat", json={"message": "forget that I moved to Berlin"}, headers=auth
    )
    assert response.status_code == 502, response.text
    assert len((await memories(api, auth))["memories"]) == 2
