"""The local demo shows memory: with no OPENAI_API_KEY (the offline
responder), what the user said reaches the answer through memchat's own
memory: the session's window, the long-term notes, recall across sessions."""

from __future__ import annotations

import uuid
from collections.abc import Callable

from memchat.model import offline
from tests.utils.api import ApiClient
from tests.utils.chat_api import chat


async def test_my_name_then_what_is_my_name_in_one_session(
    custom_api: Callable[..., ApiClient],
) -> None:
    api = custom_api(openai_api_key=None, offline_model=True)
    _, auth = api.new_user()
    told = await chat(api, auth, "my name is Ana")
    asked = await chat(api, auth, "what is my name?", session_id=told["session_id"])
    assert asked["answer"].startswith(
        f"{offline.LABEL} Your name is Ana ({offline.THIS_CONVERSATION})."
    )
    assert asked["memory"]["messages_in_context"] == 2


async def test_a_remembered_name_answers_in_a_new_session_from_the_notes(
    custom_api: Callable[..., ApiClient],
) -> None:
    api = custom_api(openai_api_key=None, offline_model=True, memory_recall_k=0)
    _, auth = api.new_user()
    remembered = await chat(api, auth, "remember my name is Ana")
    assert remembered["memory"]["long_term_notes_updated"] is True
    asked = await chat(api, auth, "who am I?", session_id=str(uuid.uuid4()))
    assert f"Your name is Ana ({offline.NOTES})." in asked["answer"]


async def test_a_fact_from_another_session_answers_through_recall(
    custom_api: Callable[..., ApiClient],
) -> None:
    api = custom_api(openai_api_key=None, offline_model=True)
    _, auth = api.new_user()
    await chat(api, auth, "my favourite colour is teal")
    asked = await chat(api, auth, "what is my favourite colour?", session_id=str(uuid.uuid4()))
    assert asked["memory"]["recall_status"] == "ok"
    assert f"Your favourite colour is teal ({offline.EARLIER_CONVERSATION})." in asked["answer"]


async def test_without_memory_the_offline_answer_knows_nothing(
    custom_api: Callable[..., ApiClient],
) -> None:
    api = custom_api(openai_api_key=None, offline_model=True)
    _, auth = api.new_user()
    told = await chat(api, auth, "my name is Ana")
    asked = await chat(
        api, auth, "what is my name?", session_id=told["session_id"], use_memory=False
    )
    assert "Your name is" not in asked["answer"]
    assert "This is the start of our conversation." in asked["answer"]
