"""POST /v1/chat/completions and GET /v1/models: memchat as an OpenAI-compatible
endpoint, with memory (usecases/completions.py says how a request becomes a
turn; the turn is POST /chat's own)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Header, Request, Response
from fastapi.responses import JSONResponse

from memchat.api.deps import CurrentUser, State
from memchat.api.openai_errors import OpenAIRoute
from memchat.api.schemas import UuidHeader, parse_session_id
from memchat.api.schemas.openai import (
    REQUEST_SCHEMA,
    ModelOut,
    ModelsOut,
    openai_error_responses,
)
from memchat.usecases import completions

router = APIRouter(tags=["openai"], route_class=OpenAIRoute)

_COMPLETION_RESPONSES = {
    200: {
        "description": "A `chat.completion`, or with `stream: true` `chat.completion.chunk`"
        " Server-Sent Events ending in `data: [DONE]`; both with a top-level `memchat`"
        " object (the session, what memory did).",
        "content": {
            "application/json": {"schema": {"type": "object"}},
            "text/event-stream": {"schema": {"type": "string"}},
        },
        "headers": {
            "X-Memchat-Session-ID": {
                "description": "The session the turn was stored in (also X-Session-ID).",
                "schema": {"type": "string", "format": "uuid"},
            },
            "X-Memchat-Context-Tokens": {
                "description": "Tokens memory added to the prompt.",
                "schema": {"type": "integer"},
            },
            "X-Memchat-Recalled": {
                "description": "Earlier exchanges recalled into the prompt.",
                "schema": {"type": "integer"},
            },
        },
    },
    **openai_error_responses(
        400,
        404,
        409,
        413,
        422,
        429,
        502,
        504,
        descriptions={
            400: "A field memchat refuses rather than drop (`n`, `stop`, ...), no user"
            " message, malformed JSON, a continuation of a call memchat did not make"
            " (`bad_request`, `invalid_json`, `unknown_tool_call`)",
            413: "A message sent to the model over MAX_MESSAGE_CHARS, all of them with the"
            " tool schemas over MAX_REQUEST_CHARS (`payload_too_large`, naming the field),"
            " or the user's stored messages at USER_MAX_STORED_MESSAGES (`quota_exceeded`)",
            404: "model names no memchat model (`model_not_found`), or the session is"
            " not the caller's (`session_not_found`)",
        },
    ),
}


@router.post(
    "/v1/chat/completions",
    response_model=None,
    responses=_COMPLETION_RESPONSES,
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": REQUEST_SCHEMA}},
        }
    },
)
async def create_completion(
    body: Annotated[dict[str, Any], Body()],
    caller: CurrentUser,
    state: State,
    request: Request,
    x_session_id: Annotated[
        UuidHeader, Header(description="The session, as metadata.session_id.")
    ] = None,
    x_openwebui_chat_id: Annotated[
        str | None,
        Header(description="Open WebUI's chat id (forwarded user info headers): the session."),
    ] = None,
    x_conversation_id: Annotated[
        str | None,
        Header(description="A chat front end's id of the chat (e.g. LibreChat's): the session."),
    ] = None,
) -> Response:
    """A chat turn, asked and answered as OpenAI's Chat Completions: the last
    user message is the new one; memchat adds its memory and stores the turn."""
    asked = completions.parse(
        body,
        header_session_id=parse_session_id(x_session_id, "X-Session-ID"),
        chat_ids=list(
            zip(completions.CHAT_ID_HEADERS, (x_openwebui_chat_id, x_conversation_id), strict=True)
        ),
        bounds=completions.TextBounds.of(state.settings),
    )
    asked = await completions.resolve(
        state.db, caller, asked, state.settings.memory_max_history_messages
    )
    if asked.stream:
        # Imported here: most turns through /v1 are not streamed, and none
        # of the chat function's cold start needs the chunk writer.
        from memchat.api.completion_stream import ChunkStream
        from memchat.usecases.streaming import StreamedTurn

        turn = StreamedTurn()
        start = await turn.begin(state.chat.run(caller, asked.turn, turn))
        return ChunkStream(
            request,
            turn,
            start,
            asked,
            keepalive_seconds=state.settings.stream_keepalive_seconds,
        )
    result = await state.chat.run(caller, asked.turn)
    return JSONResponse(
        completions.completion(result, asked),
        headers=completions.memory_headers(str(result.session_id), result.memory),
    )


@router.get(
    "/v1/models",
    response_model=ModelsOut,
    responses=openai_error_responses(),
)
async def list_models(caller: CurrentUser, state: State) -> ModelsOut:
    """The models the caller may name: `memchat` (the default agent) and
    `memchat:<agent_name>` for each agent they have talked to."""
    created = completions.now()
    names = await completions.list_models(state.db, caller)
    return ModelsOut(data=[ModelOut(id=name, created=created) for name in names])
