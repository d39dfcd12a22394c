"""How `memchat import` reads a file and splits it into requests
(memchat.cli.history_import): an account export's durable memories, in
either form, go with the first request, only those of sessions the file
does not hold."""

from __future__ import annotations

import json

import pytest

from memchat.cli.history_import import (
    chunks,
    durable_memories,
    from_ndjson,
    request_body,
    sessions_of,
)

GONE = "11111111-1111-4111-8111-111111111111"
HELD = "22222222-2222-4222-8222-222222222222"


def memory(session_id: str, text: str) -> dict[str, object]:
    return {
        "id": 1,
        "agent_name": "default",
        "kind": "fact",
        "text": text,
        "session_id": session_id,
        "message_id": 9,
        "created_at": "2024-03-01T12:00:00+00:00",
        "expires_at": None,
    }


def ndjson(*items: dict[str, object]) -> str:
    return "".join(json.dumps(item) + "\n" for item in items)


def test_an_exports_memory_lines_are_read_and_only_those_of_sessions_gone_kept() -> None:
    text = ndjson(
        {"type": "export", "user_id": "u", "exported_at": "2024-03-02T00:00:00Z"},
        {"type": "session", "id": HELD, "agent_name": "default"},
        {"type": "message", "session_id": HELD, "role": "user", "content": "hi"},
        {"type": "memory", **memory(GONE, "I moved to Berlin.")},
        {"type": "memory", **memory(HELD, "I said hi.")},
    )
    document = from_ndjson(text)
    assert [m["text"] for m in document["memories"]] == ["I moved to Berlin.", "I said hi."]
    sessions, _ = sessions_of(document)
    assert [m["text"] for m in durable_memories(document, sessions)] == ["I moved to Berlin."]
    # No memory lines: no "memories" key, as before.
    plain = ndjson({"type": "export"}, {"type": "session", "id": HELD})
    assert "memories" not in from_ndjson(plain)


def test_memories_go_with_the_first_request_and_count_against_its_size() -> None:
    sessions = [{"id": HELD, "messages": [{"role": "user", "content": "x" * 50}]}] * 3
    kept = [memory(GONE, "I moved to Berlin.")]
    bodies = list(chunks(sessions, [], max_bytes=400, max_sessions=1, memories=kept))
    assert [len(b["sessions"]) for b in bodies] == [1, 1, 1]
    assert bodies[0]["memories"] == kept and all("memories" not in b for b in bodies[1:])
    assert all(len(request_body(b)) <= 400 for b in bodies)
    # Memories alone: one request that holds them.
    assert list(chunks([], [], max_bytes=400, max_sessions=1, memories=kept)) == [
        {"sessions": [], "memories": kept}
    ]
    with pytest.raises(ValueError, match="memories alone are over 100 bytes"):
        list(chunks(sessions, [], max_bytes=100, max_sessions=1, memories=kept))
