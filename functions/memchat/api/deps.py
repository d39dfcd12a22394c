"""Reusable dependencies: the app state and the verified caller."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Query, Request

from memchat.api.state import AppState
from memchat.config import AGENT_NAME_PATTERN
from memchat.errors import Unauthorized
from memchat.store import Caller


def get_state(request: Request) -> AppState:
    state: AppState = request.app.state.memchat
    return state


State = Annotated[AppState, Depends(get_state)]


def current_user(request: Request, state: State) -> Caller:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized()
    return state.verifier.verify(token.strip())


CurrentUser = Annotated[Caller, Depends(current_user)]

AgentQuery = Annotated[
    str,
    Query(pattern=AGENT_NAME_PATTERN, description="Agent name; default 'default'."),
]
