"""POST /chat: one turn with the agent."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Request, Response

from memchat.api import sse
from memchat.api.deps import CurrentUser, State
from memchat.api.schemas import UuidHeader, error_responses, parse_session_id
from memchat.api.schemas.chat import ChatBody, ChatResponse, MemoryInfo, SessionMeta, Usage
from memchat.usecases.chat import ChatRequest, ChatResult, one_session_id
from memchat.usecases.streaming import StreamedTurn

router = APIRouter(tags=["chat"])

_CHAT_RESPONSES = {
    200: {
        "description": "The answer: JSON, or with `Accept: text/event-stream` (or"
        ' `"stream": true`) Server-Sent Events: `start`, `delta`..., `notes`, then'
        " `done` (the JSON body) or `error` (the error JSON); `: keep-alive` comments.",
        "content": {
            "text/event-stream": {"schema": sse.EVENT_SCHEMA},
        },
        "headers": {
            "X-Session-ID": {
                "description": "The session the turn was stored in.",
                "schema": {"type": "string", "format": "uuid"},
            }
        },
    },
    **error_responses(
        400,
        404,
        409,
        413,
        422,
        429,
        502,
        504,
        descriptions={
            409: "This client_message_id was used with another message"
            " (`idempotency_conflict`) or is still being answered (`idempotency_in_flight`,"
            " with Retry-After)",
            413: "Message over MAX_MESSAGE_CHARS, or body over 1 MB (`payload_too_large`)",
        },
    ),
}


@router.post("/chat", response_model=ChatResponse, responses=_CHAT_RESPONSES)
async def chat(
    body: ChatBody,
    caller: CurrentUser,
    state: State,
    request: Request,
    response: Response,
    x_session_id: Annotated[
        UuidHeader, Header(description="The session, as body session_id.")
    ] = None,
) -> ChatResponse | sse.EventStream:
    """Send a message; the answer sees the conversation so far and the user's notes.

    With `Accept: text/event-stream` or `"stream": true` the answer comes as
    Server-Sent Events as the model writes it: `start`, `delta`..., `notes`,
    then `done` (this body) or `error` (the error JSON)."""
    session_id = one_session_id(
        [
            ("X-Session-ID", parse_session_id(x_session_id, "X-Session-ID")),
            ("body session_id", parse_session_id(body.session_id)),
        ]
    )
    turn_request = ChatRequest(
        message=body.message,
        session_id=session_id,
        agent_name=body.agent_name,
        use_memory=body.use_memory,
        max_history_messages=body.max_history_messages,
        client_message_id=body.client_message_id,
        recall_k=body.recall_k,
        search_memory=body.search_memory,
        sampling=body.sampling(),
        suggest=body.suggest,
    )
    if body.stream or sse.wants_stream(request.headers.get("accept")):
        turn = StreamedTurn()
        # Failures before the turn starts raise here, with their own status.
        start = await turn.begin(state.chat.run(caller, turn_request, turn))
        start.data["memory"] = MemoryInfo(**start.data["memory"]).model_dump(mode="json")
        return sse.EventStream(
            request,
            turn,
            start,
            done=lambda result: chat_response(result).model_dump(mode="json"),
            keepalive_seconds=state.settings.stream_keepalive_seconds,
        )
    result = await state.chat.run(caller, turn_request)
    response.headers["X-Session-ID"] = str(result.session_id)
    return chat_response(result)


def chat_response(result: ChatResult) -> ChatResponse:
    """The turn's body: the non-streaming response, and the `done` event."""
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
        message_id=result.message_id,
        user_message_id=result.user_message_id,
        suggestions=result.suggestions,
    )
