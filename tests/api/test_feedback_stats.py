"""Message ids, feedback on answers, usage kept, and the caller's stats (issue 13).

Everything through the HTTP API on the real database; the model is the
fake OpenAI server (its usage: 11 prompt and 7 completion tokens a call).
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

import psycopg
import pytest
from langchain_core.messages import AIMessage
from langchain_postgres import PostgresChatMessageHistory

from memchat import store
from memchat.usecases.cleanup import Cleanup
from tests.utils.api import ApiClient
from tests.utils.chat_api import chat
from tests.utils.fake_openai import FakeOpenAI, tool_call
from tests.utils.sse import parse

STREAM = {"Accept": "text/event-stream"}


def stored(admin: psycopg.Connection, session_id: str) -> list[tuple[int, str, bool]]:
    """(id, type, calls tools) of a session's messages, in order."""
    rows = admin.execute(
        "select id, message->>'type',"
        "       coalesce(jsonb_array_length(message->'data'->'tool_calls'), 0) > 0"
        "  from public.chat_message_history where session_id = %s order by id",
        (uuid.UUID(session_id),),
    ).fetchall()
    return [(int(i), str(t), bool(c)) for i, t, c in rows]


def feedback_rows(admin: psycopg.Connection, user_id: uuid.UUID) -> int:
    row = admin.execute(
        "select count(*) from memchat.message_feedback where user_id = %s", (user_id,)
    ).fetchone()
    assert row is not None
    return int(row[0])


# ------------------------------------------------------------ message ids


async def test_the_response_names_the_stored_messages(
    api: ApiClient, model: FakeOpenAI, admin: psycopg.Connection
) -> None:
    _, auth = api.new_user()
    model.script(tool_call("append", content="- likes tea"), {"content": "Noted."})
    body = await chat(api, auth, "remember tea", client_message_id="k-1")

    rows = stored(admin, body["session_id"])
    assert [t for _, t, _ in rows] == ["human", "ai", "tool", "ai"]
    assert body["user_message_id"] == rows[0][0]
    assert body["message_id"] == rows[-1][0]

    # A retry replays the same ids; the export carries the same ids.
    again = await chat(api, auth, "remember tea", client_message_id="k-1")
    assert (again["message_id"], again["user_message_id"]) == (
        body["message_id"],
        body["user_message_id"],
    )
    export = (await api.get(f"/chat/export/{body['session_id']}", headers=auth)).json()
    assert [m["id"] for m in export["messages"]] == [i for i, _, _ in rows]


async def test_the_streamed_done_event_names_them_too(
    api: ApiClient, admin: psycopg.Connection
) -> None:
    _, auth = api.new_user()
    r = await api.post("/chat", json={"message": "hello"}, headers={**auth, **STREAM})
    done = parse(r.text)[-1]
    assert done.name == "done"
    rows = stored(admin, done.data["session_id"])
    assert (done.data["user_message_id"], done.data["message_id"]) == (rows[0][0], rows[-1][0])


async def test_nothing_stored_means_no_ids(api: ApiClient) -> None:
    _, auth = api.new_user()
    body = await chat(api, auth, "off the record", use_memory=False)
    assert body["message_id"] is None and body["user_message_id"] is None


# ------------------------------------------------------------ usage kept


async def test_usage_model_and_latency_are_stored_where_langchain_reads_them(
    api: ApiClient, admin_url: str
) -> None:
    _, auth = api.new_user()
    body = await chat(api, auth, "hello")
    with psycopg.connect(admin_url) as conn:
        history = PostgresChatMessageHistory(
            "chat_message_history", body["session_id"], sync_connection=conn
        )
        answer = history.get_messages()[-1]
    assert isinstance(answer, AIMessage)
    assert answer.usage_metadata == {"input_tokens": 11, "output_tokens": 7, "total_tokens": 18}
    metadata = answer.response_metadata
    assert metadata["model_name"] == body["model"] == "fake-model"
    assert metadata["token_usage"] == {
        "prompt_tokens": 11,
        "completion_tokens": 7,
        "total_tokens": 18,
    }
    assert metadata["latency_ms"] > 0
    assert metadata["memchat"] == {"recalled": 0, "summary_used": False}


# --------------------------------------------------------------- feedback


async def test_feedback_on_an_answer_is_kept_replaced_and_removed(
    api: ApiClient, admin: psycopg.Connection
) -> None:
    user_id, auth = api.new_user()
    body = await chat(api, auth, "hello")
    answer = body["message_id"]

    r = await api.post("/chat/feedback", json={"message_id": answer, "rating": 1}, headers=auth)
    assert r.status_code == 200, r.text
    first = r.json()
    assert first["message_id"] == answer and first["rating"] == 1 and first["comment"] is None
    assert first["session_id"] == body["session_id"] and first["agent_name"] == "default"

    r = await api.post(
        "/chat/feedback",
        json={"message_id": answer, "rating": -1, "comment": "too short"},
        headers=auth,
    )
    second = r.json()
    assert (second["rating"], second["comment"]) == (-1, "too short")
    assert second["created_at"] == first["created_at"]
    assert second["updated_at"] >= first["updated_at"]
    assert feedback_rows(admin, user_id) == 1

    export = (await api.get(f"/chat/export/{body['session_id']}", headers=auth)).json()
    rated = [m for m in export["messages"] if "feedback" in m]
    assert [m["id"] for m in rated] == [answer]
    assert rated[0]["feedback"]["rating"] == -1 and rated[0]["feedback"]["comment"] == "too short"

    r = await api.delete(f"/chat/feedback/{answer}", headers=auth)
    assert r.status_code == 200 and r.json() == {"message_id": answer, "deleted": True}
    r = await api.delete(f"/chat/feedback/{answer}", headers=auth)
    assert r.status_code == 200 and r.json() == {"message_id": answer, "deleted": False}
    assert feedback_rows(admin, user_id) == 0


async def test_feedback_only_on_the_callers_own_answers(
    api: ApiClient, model: FakeOpenAI, admin: psycopg.Connection
) -> None:
    alice_id, alice = api.new_user()
    bob_id, bob = api.new_user()
    model.script(tool_call("append", content="- x"), {"content": "Done."})
    body = await chat(api, alice, "remember x")
    user_msg, tool_round, tool_result, answer = (i for i, _, _ in stored(admin, body["session_id"]))

    for message_id in (user_msg, tool_round, tool_result, answer + 1000, 2**63 - 1):
        r = await api.post(
            "/chat/feedback", json={"message_id": message_id, "rating": 1}, headers=alice
        )
        assert r.status_code == 404, (message_id, r.text)
        assert r.json()["error"] == "message_not_found"
    # Bob cannot rate, unrate or see Alice's answer.
    r = await api.post("/chat/feedback", json={"message_id": answer, "rating": 1}, headers=bob)
    assert r.status_code == 404
    await api.post("/chat/feedback", json={"message_id": answer, "rating": 1}, headers=alice)
    r = await api.delete(f"/chat/feedback/{answer}", headers=bob)
    assert r.status_code == 404 and r.json()["error"] == "message_not_found"
    assert feedback_rows(admin, alice_id) == 1 and feedback_rows(admin, bob_id) == 0


@pytest.mark.parametrize(
    "fields",
    [
        {"rating": 2},
        {"rating": -2},
        {"rating": 0.5},
        {"rating": None},
        {"rating": "up"},
        {},
        {"rating": 1, "comment": "x" * 2001},
        {"rating": 1, "comment": "nul \x00"},
        {"rating": 1, "extra": True},
        {"rating": 1, "message_id": 0},
        {"rating": 1, "message_id": 2**63},
    ],
)
async def test_bad_feedback_is_422(api: ApiClient, fields: dict[str, Any]) -> None:
    _, auth = api.new_user()
    body = await chat(api, auth, "hello")
    r = await api.post(
        "/chat/feedback", json={"message_id": body["message_id"], **fields}, headers=auth
    )
    assert r.status_code == 422, r.text
    assert set(r.json()) == {"error", "detail", "request_id"}


async def test_a_2000_character_comment_is_kept(api: ApiClient) -> None:
    _, auth = api.new_user()
    body = await chat(api, auth, "hello")
    comment = "é" * 2000
    r = await api.post(
        "/chat/feedback",
        json={"message_id": body["message_id"], "rating": 0, "comment": comment},
        headers=auth,
    )
    assert r.status_code == 200 and r.json()["comment"] == comment


async def test_feedback_goes_with_its_message(
    api: ApiClient, admin: psycopg.Connection, cleanup_url: str
) -> None:
    """clear-session, DELETE /me and the TTL cleanup remove it."""
    user_id, auth = api.new_user()

    async def rated() -> dict[str, Any]:
        body = await chat(api, auth, "hello", session_id=str(uuid.uuid4()))
        r = await api.post(
            "/chat/feedback", json={"message_id": body["message_id"], "rating": 1}, headers=auth
        )
        assert r.status_code == 200
        return body

    cleared, expired = await rated(), await rated()
    assert feedback_rows(admin, user_id) == 2
    r = await api.post(
        "/chat/clear-session", json={"session_id": cleared["session_id"]}, headers=auth
    )
    assert r.status_code == 200
    assert feedback_rows(admin, user_id) == 1

    admin.execute(
        "update public.chat_sessions set expires_at = now() - interval '1 minute' where id = %s",
        (uuid.UUID(expired["session_id"]),),
    )
    Cleanup(cleanup_url, batch_size=1000, pause_factor=1.0).run()
    assert feedback_rows(admin, user_id) == 0

    await rated()
    assert feedback_rows(admin, user_id) == 1
    assert (await api.delete("/me", headers=auth)).status_code == 200
    assert feedback_rows(admin, user_id) == 0


# ------------------------------------------------------------------ stats


async def test_stats_match_a_scripted_history(
    api: ApiClient, model: FakeOpenAI, admin: psycopg.Connection
) -> None:
    _, auth = api.new_user()
    empty = (await api.get("/chat/stats", headers=auth)).json()
    assert empty == {
        "agent_name": None,
        "sessions": {"total": 0, "active": 0, "cleared": 0},
        "messages": 0,
        "turns": 0,
        "tokens": {"prompt": 0, "completion": 0},
        "feedback": {"positive": 0, "negative": 0, "neutral": 0, "with_comment": 0},
        "first_activity_at": None,
        "last_activity_at": None,
        "avg_messages_per_session": 0.0,
        "storage": {
            "stored_messages": 0,
            "max_stored_messages": api.settings.user_max_stored_messages,
        },
    }

    # Agent "default": a session of 3 turns (one with a tool round) and one of
    # 1 turn that is then cleared; agent "coach": 1 turn.
    model.script(tool_call("append", content="- a"), {"content": "ok"})
    first = await chat(api, auth, "one")
    second = await chat(api, auth, "two", session_id=first["session_id"])
    third = await chat(api, auth, "three", session_id=first["session_id"])
    gone = await chat(api, auth, "four", session_id=str(uuid.uuid4()))
    coach = await chat(api, auth, "five", agent_name="coach")
    turns = [first, second, third, gone, coach]
    await api.post("/chat/clear-session", json={"session_id": gone["session_id"]}, headers=auth)
    for body, rating, comment in ((first, 1, "good"), (second, -1, None), (coach, 0, "meh")):
        r = await api.post(
            "/chat/feedback",
            json={"message_id": body["message_id"], "rating": rating, "comment": comment},
            headers=auth,
        )
        assert r.status_code == 200

    every = (await api.get("/chat/stats", headers=auth)).json()
    sessions = (await api.get("/sessions", headers=auth)).json()["sessions"]
    assert every["sessions"] == {"total": 4, "active": 3, "cleared": 1}  # + clear's new one
    assert every["messages"] == 4 + 2 + 2 + 2  # tool round: 4 messages; "four" cleared
    assert every["turns"] == 5  # kept when cleared
    assert every["tokens"] == {
        "prompt": sum(t["usage"]["prompt_tokens"] for t in turns),
        "completion": sum(t["usage"]["completion_tokens"] for t in turns),
    }
    assert every["tokens"]["prompt"] == 11 * 6  # six model calls
    assert every["feedback"] == {"positive": 1, "negative": 1, "neutral": 1, "with_comment": 2}
    assert every["first_activity_at"] == min(s["created_at"] for s in sessions)
    assert every["last_activity_at"] == max(s["last_active_at"] for s in sessions)
    assert every["avg_messages_per_session"] == 2.5
    assert every["storage"] == {
        "stored_messages": every["messages"],
        "max_stored_messages": api.settings.user_max_stored_messages,
    }

    default = (await api.get("/chat/stats", params={"agent_name": "default"}, headers=auth)).json()
    assert default["agent_name"] == "default"
    assert default["sessions"] == {"total": 3, "active": 2, "cleared": 1}
    assert (default["messages"], default["turns"]) == (8, 4)
    assert default["storage"] == every["storage"]  # the user's, whatever the agent
    assert default["feedback"] == {"positive": 1, "negative": 1, "neutral": 0, "with_comment": 1}

    one = (await api.get(f"/chat/stats/{first['session_id']}", headers=auth)).json()
    assert one["session_id"] == first["session_id"] and one["status"] == "active"
    assert (one["messages"], one["turns"]) == (8, 3)
    assert one["tokens"] == {
        "prompt": sum(t["usage"]["prompt_tokens"] for t in (first, second, third)),
        "completion": sum(t["usage"]["completion_tokens"] for t in (first, second, third)),
    }
    assert one["feedback"] == {"positive": 1, "negative": 1, "neutral": 0, "with_comment": 1}
    assert one["first_activity_at"] == first["session"]["created_at"]
    assert one["last_activity_at"] == third["session"]["last_active_at"]
    # From the first to the last activity, to the millisecond: Postgres rounds the
    # numeric half away from zero, so a span of 34.5 ms is 0.035 (exact decimals here,
    # a float tolerance of half a millisecond fails on such a tie).
    span = datetime.fromisoformat(one["last_activity_at"]) - datetime.fromisoformat(
        one["first_activity_at"]
    )
    expected = (Decimal(span // timedelta(microseconds=1)) / 1_000_000).quantize(
        Decimal("0.001"), rounding=ROUND_HALF_UP
    )
    assert one["duration_seconds"] == float(expected), (one, span)
    assert span.total_seconds() > 0  # three turns, one after the other
    cleared = (await api.get(f"/chat/stats/{gone['session_id']}", headers=auth)).json()
    assert (cleared["status"], cleared["messages"], cleared["turns"]) == ("cleared", 0, 1)


async def test_stats_never_include_another_users_rows(
    api: ApiClient, db: Any, admin: psycopg.Connection
) -> None:
    alice_id, alice = api.new_user()
    bob_id, bob = api.new_user()
    body = await chat(api, alice, "mine")
    await api.post(
        "/chat/feedback", json={"message_id": body["message_id"], "rating": 1}, headers=alice
    )

    bobs = (await api.get("/chat/stats", headers=bob)).json()
    assert bobs["sessions"]["total"] == 0 and bobs["turns"] == 0
    assert bobs["feedback"]["positive"] == 0
    r = await api.get(f"/chat/stats/{body['session_id']}", headers=bob)
    assert r.status_code == 404 and r.json()["error"] == "session_not_found"

    # At the SQL level, as the API runs it (memchat_user with Bob's claims).
    as_bob = store.Caller(bob_id, {"sub": str(bob_id), "role": "authenticated"})
    assert (await store.chat_stats(db, as_bob, None))["turns"] == 0
    assert await store.session_stats(db, as_bob, uuid.UUID(body["session_id"])) is None
    as_alice = store.Caller(alice_id, {"sub": str(alice_id), "role": "authenticated"})
    assert (await store.chat_stats(db, as_alice, None))["turns"] == 1


@pytest.mark.parametrize(
    ("path", "status"),
    [
        ("/chat/stats/not-a-uuid", 400),
        (f"/chat/stats/{uuid.uuid4()}", 404),
        ("/chat/stats?agent_name=bad%20name", 422),
        ("/chat/feedback/0", 422),
        ("/chat/feedback/abc", 422),
    ],
)
async def test_bad_stats_and_feedback_paths(api: ApiClient, path: str, status: int) -> None:
    _, auth = api.new_user()
    method = api.delete if path.startswith("/chat/feedback") else api.get
    r = await method(path, headers=auth)
    assert r.status_code == status, r.text
    assert set(r.json()) == {"error", "detail", "request_id"}
