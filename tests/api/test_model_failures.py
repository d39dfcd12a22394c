"""POST /chat when the model server answers 200 with something unusable.

A broken body (not JSON, HTML, wrong types) is the provider's failure: 502
`model_upstream_error`, nothing stored. Text the database cannot encode (lone
UTF-16 surrogates) is repaired instead: the turn is answered and stored with
U+FFFD in its place.

Everything goes through the real `openai` client and the fake HTTP server;
rows are checked with the superuser connection.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import psycopg
import pytest

from tests.utils.api import ApiClient
from tests.utils.chat_api import assert_error, chat, stored_notes
from tests.utils.fake_openai import FakeOpenAI, tool_call
from tests.utils.store_data import contents, snapshot, stored_messages

LONE = "\ud800"  # a high surrogate with no low one after it
FFFD = "\ufffd"


def _call(**fields: Any) -> dict[str, Any]:
    """A scripted reply with one tool call whose fields are `fields` over sane ones."""
    call: dict[str, Any] = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "manage_long_term_memory", "arguments": '{"operation": "read"}'},
    }
    function = fields.pop("function", {})
    call.update(fields)
    if isinstance(function, dict) and isinstance(call["function"], dict):
        call["function"] = {**call["function"], **function}
    else:
        call["function"] = function
    return {"tool_calls": [call]}


HTML = "<html><head><title>502 Bad Gateway</title></head><body>nginx</body></html>"

MALFORMED: dict[str, dict[str, Any]] = {
    # The body is not a JSON completion at all.
    "truncated-json": {"raw": '{"id": "chatcmpl-1", "choices": [{"message": {"content": "hi'},
    "empty-body": {"raw": ""},
    "html": {"raw": HTML, "content_type": "text/html"},
    "html-labelled-json": {"raw": HTML},
    "plain-text": {"raw": "upstream overloaded", "content_type": "text/plain"},
    "json-array": {"raw": "[1, 2, 3]"},
    "json-string": {"raw": '"hello"'},
    "invalid-utf8": {"raw": b'{"choices": [], "model": "\xff\xfe"}'},
    "deeply-nested": {"raw": "[" * 100_000 + "]" * 100_000},
    # Top-level fields of the wrong type.
    "usage-string": {"override": {"usage": "lots"}},
    "usage-tokens-string": {"override": {"usage": {"prompt_tokens": "11"}}},
    "usage-tokens-negative": {"override": {"usage": {"prompt_tokens": -1}}},
    "usage-tokens-bool": {"override": {"usage": {"completion_tokens": True}}},
    "choices-string": {"override": {"choices": "x"}},
    "choices-object": {"override": {"choices": {"message": {"content": "hi"}}}},
    "choice-string": {"override": {"choices": ["x"]}},
    "message-string": {"override": {"choices": [{"index": 0, "message": "x"}]}},
    "message-missing": {"override": {"choices": [{"index": 0, "finish_reason": "stop"}]}},
    "model-number": {"override": {"model": 5}},
    "model-object": {"override": {"model": {"name": "gpt"}}},
    # The message's content.
    "content-number": {"content": 42},
    "content-object": {"content": {"text": "hi"}},
    "content-list": {"content": [{"type": "text", "text": "hi"}]},
    "content-bool": {"content": False},
    # Tool calls.
    "tool-calls-string": {"tool_calls": "x"},
    "tool-calls-object": {"tool_calls": {"id": "call_1"}},
    "tool-call-string": {"tool_calls": ["x"]},
    "tool-call-function-string": _call(function="manage_long_term_memory"),
    "tool-call-name-number": _call(function={"name": 5}),
    "tool-call-name-missing": _call(function={"name": None}),
    "tool-call-arguments-object": _call(function={"arguments": {"operation": "read"}}),
    "tool-call-arguments-number": _call(function={"arguments": 1}),
    "tool-call-id-number": _call(id=7),
    "tool-call-id-missing": _call(id=None),
}


@pytest.mark.parametrize("reply", MALFORMED.values(), ids=MALFORMED.keys())
async def test_an_unreadable_answer_is_502_and_stores_nothing(
    api: ApiClient, model: FakeOpenAI, admin: psycopg.Connection, reply: dict[str, Any]
) -> None:
    user_id, auth = api.new_user()
    sid = (await chat(api, auth, "a first turn that is stored"))["session_id"]
    before = snapshot(admin, user_id)
    calls = model.calls

    model.script(reply)
    r = await api.post("/chat", json={"message": "and now?", "session_id": sid}, headers=auth)
    body = assert_error(r, 502, "model_upstream_error")
    assert "nothing was stored" in body["detail"]
    assert model.calls == calls + 1  # asked once: a bad body is not retried as a turn
    assert snapshot(admin, user_id) == before


@pytest.mark.parametrize(
    "reply",
    [MALFORMED["html"], MALFORMED["usage-string"], MALFORMED["content-object"]],
    ids=["html", "usage-string", "content-object"],
)
async def test_an_unreadable_answer_without_memory_is_502_too(
    api: ApiClient, model: FakeOpenAI, admin: psycopg.Connection, reply: dict[str, Any]
) -> None:
    user_id, auth = api.new_user()
    model.script(reply)
    r = await api.post("/chat", json={"message": "hi", "use_memory": False}, headers=auth)
    assert_error(r, 502, "model_upstream_error")
    assert all(rows == [] for rows in snapshot(admin, user_id).values())


async def test_an_unreadable_answer_after_a_tool_round_keeps_the_notes_unchanged(
    api: ApiClient, model: FakeOpenAI, admin: psycopg.Connection
) -> None:
    user_id, auth = api.new_user()
    model.script(tool_call("append", content="- likes tea"), MALFORMED["usage-string"])
    r = await api.post("/chat", json={"message": "I like tea"}, headers=auth)
    assert_error(r, 502, "model_upstream_error")
    assert model.calls == 2
    assert stored_notes(admin, user_id) is None
    assert all(rows == [] for rows in snapshot(admin, user_id).values())


# ------------------------------------------------------------ lone surrogates


def _stored_text(admin: psycopg.Connection, session_id: str) -> str:
    """The session's stored messages as PostgreSQL renders their jsonb."""
    rows = admin.execute(
        "select message::text from public.chat_message_history where session_id = %s order by id",
        (session_id,),
    ).fetchall()
    return "\n".join(r[0] for r in rows)


async def test_a_lone_surrogate_in_the_answer_is_stored_as_a_replacement_character(
    api: ApiClient, model: FakeOpenAI, admin: psycopg.Connection
) -> None:
    _, auth = api.new_user()
    model.script({"content": f"caf{LONE}é"})
    body = await chat(api, auth, "hi")
    assert body["answer"] == f"caf{FFFD}é"
    assert contents(admin, uuid.UUID(body["session_id"])) == [
        ("human", "hi"),
        ("ai", f"caf{FFFD}é"),
    ]
    assert FFFD in _stored_text(admin, body["session_id"])


async def test_a_surrogate_pair_is_kept(
    api: ApiClient, model: FakeOpenAI, admin: psycopg.Connection
) -> None:
    # JSON carries "😀" as the escaped pair \ud83d\ude00: it is valid and must not
    # be replaced.
    _, auth = api.new_user()
    model.script({"content": "tea 😀"})
    body = await chat(api, auth, "hi")
    assert body["answer"] == "tea 😀"
    assert contents(admin, uuid.UUID(body["session_id"]))[-1] == ("ai", "tea 😀")


async def test_a_lone_surrogate_in_the_answer_without_memory_is_replaced(
    api: ApiClient, model: FakeOpenAI
) -> None:
    _, auth = api.new_user()
    model.script({"content": f"{LONE}x"})
    body = await chat(api, auth, "hi", use_memory=False)
    assert body["answer"] == f"{FFFD}x"


@pytest.mark.parametrize(
    "arguments",
    [
        # Escaped inside the arguments text: \ud800 only appears once it is parsed.
        json.dumps({"operation": "append", "content": f"- tea{LONE}"}),
        # Raw in the arguments text (escaped only in the outer JSON).
        json.dumps({"operation": "append", "content": f"- tea{LONE}"}, ensure_ascii=False),
    ],
    ids=["escaped-in-arguments", "raw-in-arguments"],
)
async def test_a_lone_surrogate_in_tool_arguments_reaches_notes_and_history_replaced(
    api: ApiClient, model: FakeOpenAI, admin: psycopg.Connection, arguments: str
) -> None:
    user_id, auth = api.new_user()
    model.script(_call(function={"arguments": arguments}), {"content": "Noted."})
    body = await chat(api, auth, "I like tea")
    assert body["answer"] == "Noted."
    assert stored_notes(admin, user_id) == (f"- tea{FFFD}", 1)
    stored = stored_messages(admin, uuid.UUID(body["session_id"]))
    assert [m["type"] for m in stored] == ["human", "ai", "tool", "ai"]
    assert stored[1]["data"]["tool_calls"][0]["args"] == {
        "operation": "append",
        "content": f"- tea{FFFD}",
    }
    # What was sent back to the model is the repaired JSON too.
    sent = model.requests[-1]["messages"][-2]["tool_calls"][0]["function"]["arguments"]
    assert json.loads(sent)["content"] == f"- tea{FFFD}"
    assert FFFD in _stored_text(admin, body["session_id"])


async def test_a_lone_surrogate_in_unparseable_tool_arguments_is_replaced(
    api: ApiClient, model: FakeOpenAI, admin: psycopg.Connection
) -> None:
    _, auth = api.new_user()
    model.script(_call(function={"arguments": f"not json {LONE}"}), {"content": "Sorry."})
    body = await chat(api, auth, "hi")
    stored = stored_messages(admin, uuid.UUID(body["session_id"]))
    assert stored[1]["data"]["tool_calls"][0]["args"] == {"_raw": f"not json {FFFD}"}
    assert stored[2]["data"]["content"] == "error: arguments must be a JSON object"


DEEP = 100_000
UNSTORABLE_ARGUMENTS = {
    # json.loads takes these, jsonb does not.
    "nan": '{"operation": "read", "n": NaN}',
    "infinity": '{"operation": "read", "n": -Infinity}',
    "overflow": '{"operation": "read", "n": 1e400}',
    # Deeper than json.loads can go, and deep enough to trouble what walks it next.
    "too-deep-to-parse": "[" * DEEP + "]" * DEEP,
    "deep": '{"operation": "read", "n": ' + "[" * 100 + "]" * 100 + "}",
    "deep-with-nul-escape": '{"n": ' + "[" * 900 + '"\\u0000"' + "]" * 900 + "}",
}


@pytest.mark.parametrize(
    "arguments", UNSTORABLE_ARGUMENTS.values(), ids=UNSTORABLE_ARGUMENTS.keys()
)
async def test_tool_arguments_jsonb_cannot_hold_are_refused_and_stored_as_text(
    api: ApiClient, model: FakeOpenAI, admin: psycopg.Connection, arguments: str
) -> None:
    user_id, auth = api.new_user()
    model.script(_call(function={"arguments": arguments}), {"content": "Sorry."})
    body = await chat(api, auth, "hi")
    assert body["answer"] == "Sorry."
    stored = stored_messages(admin, uuid.UUID(body["session_id"]))
    assert stored[1]["data"]["tool_calls"][0]["args"] == {"_raw": arguments}
    assert stored[2]["data"]["content"] == "error: arguments must be a JSON object"
    assert stored_notes(admin, user_id) is None


async def test_a_lone_surrogate_in_a_tool_calls_name_and_id_is_replaced(
    api: ApiClient, model: FakeOpenAI, admin: psycopg.Connection
) -> None:
    _, auth = api.new_user()
    model.script(_call(id=f"call_{LONE}", function={"name": f"manage{LONE}"}), {"content": "Done."})
    body = await chat(api, auth, "hi")
    assert body["answer"] == "Done."
    stored = stored_messages(admin, uuid.UUID(body["session_id"]))
    call = stored[1]["data"]["tool_calls"][0]
    assert (call["id"], call["name"]) == (f"call_{FFFD}", f"manage{FFFD}")
    tool = stored[2]["data"]
    assert (tool["tool_call_id"], tool["name"]) == (f"call_{FFFD}", f"manage{FFFD}")
    assert tool["content"] == f"error: unknown tool 'manage{FFFD}'"
    assert FFFD in _stored_text(admin, body["session_id"])


async def test_a_lone_surrogate_in_the_model_name_is_replaced(
    api: ApiClient, model: FakeOpenAI, admin: psycopg.Connection
) -> None:
    _, auth = api.new_user()
    model.script({"override": {"model": f"fake{LONE}-model"}})
    body = await chat(api, auth, "hi")
    assert body["model"] == f"fake{FFFD}-model"
    stored = stored_messages(admin, uuid.UUID(body["session_id"]))
    assert stored[-1]["data"]["response_metadata"]["model_name"] == f"fake{FFFD}-model"
    assert FFFD in _stored_text(admin, body["session_id"])
