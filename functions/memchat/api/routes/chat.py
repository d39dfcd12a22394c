"""POST /chat: one turn with the agent."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Response

from memchat.api.deps import CurrentUser, State
from memchat.api.schemas import (
    ERROR_RESPONSES,
    ChatBody,
    ChatResponse,
    MemoryInfo,
    SessionMeta,
    Usage,
    parse_session_id,
)
from memchat.errors import BadRequest, PayloadTooLarge
from memchat.usecases.chat import ChatRequest

router = APIRouter(tags=["chat"])

_CHAT_ERRORS = {
    **ERROR_RESPONSES,
    413: ERROR_RESPONSES[400] | {"description": "Message too large"},
    502: ERROR_RESPONSES[400] | {"description": "Model provider failed; nothing stored"},
    504: ERROR_RESPONSES[400] | {"description": "Model timed out; nothing stored"},
}


@router.post("/chat", response_model=ChatResponse, responses=_CHAT_ERRORS)
async def chat(
    body: ChatBody,
    caller: CurrentUser,
    state: State,
    response: Response,
    x_session_id: Annotated[str | None, Header()] = None,
) -> ChatResponse:
    """Send a message; the answer sees the conversation so far and the user's notes."""
    limit = state.settings.max_message_chars
    if len(body.message) > limit:
        raise PayloadTooLarge(f"message is {len(body.message)} characters; the limit is {limit}.")
    if not body.message.strip():
        raise BadRequest("message must contain some text.")
    for name, value in (("message", body.message), ("client_message_id", body.client_message_id)):
        if value and "\x00" in value:
            # PostgreSQL cannot store NUL: refuse it before the model is paid for.
            raise BadRequest(f"{name} must not contain NUL (\\u0000) characters.")
    from_body = parse_session_id(body.session_id)
    from_header = parse_session_id(x_session_id, "X-Session-ID")
    if from_body and from_header and from_body != from_header:
        raise BadRequest("X-Session-ID and body session_id name different sessions.")
    result = await state.chat.run(
        caller,
        ChatRequest(
            message=body.message,
            session_id=from_body or from_header,
            agent_name=body.agent_name,
            use_memory=body.use_memory,
            max_history_messages=body.max_history_messages,
            client_message_id=body.client_message_id,
        ),
    )
    response.headers["X-Session-ID"] = str(result.session_id)
    session = None
    if result.session is not None:
        info = result.session.as_dict()
        session = SessionMeta(
            message_count=info["message_count"],
            created_at=info["created_at"],
            last_active_at=info["last_active_at"],
            expires_at=info["expires_at"],
        )
    return ChatResponse(
        answer=result.answer,
        session_id=str(result.session_id),
        agent_name=result.agent_name,
        model=result.model,
        usage=Usage(**result.usage),
        memory=MemoryInfo(**result.memory),
        session=session,
    )
