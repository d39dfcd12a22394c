"""Reusable dependencies: the app state and the verified caller."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Query, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from memchat.api.state import AppState
from memchat.config import AGENT_NAME_PATTERN
from memchat.errors import InvalidInput, Unauthorized
from memchat.store import Caller


def get_state(request: Request) -> AppState:
    state: AppState = request.app.state.memchat
    return state


State = Annotated[AppState, Depends(get_state)]


# Declares the bearer scheme in the OpenAPI document (the Authorize button of
# /docs); auto_error=False so a missing or other header is our 401 JSON.
_bearer = HTTPBearer(
    scheme_name="SupabaseAccessToken",
    bearerFormat="JWT",
    description="A Supabase Auth access token: `Authorization: Bearer <token>`.",
    auto_error=False,
)


USER_ID_STATE = "memchat_user_id"  # the verified caller's id, for the request's log line


def current_user(
    request: Request,
    state: State,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Caller:
    if credentials is None:
        raise Unauthorized()
    caller = state.verifier.verify(credentials.credentials)
    setattr(request.state, USER_ID_STATE, caller.user_id)
    return caller


CurrentUser = Annotated[Caller, Depends(current_user)]

AgentQuery = Annotated[
    str,
    Query(pattern=AGENT_NAME_PATTERN, description="Agent name; default 'default'."),
]
AnyAgentQuery = Annotated[
    str | None, Query(pattern=AGENT_NAME_PATTERN, description="Only this agent's.")
]
"""An optional agent filter: every agent when it is not given."""


def single_valued_query(request: Request) -> None:
    """Refuse a repeated query parameter: no endpoint takes a list, and
    `?limit=5&limit=500` must not quietly mean whichever came last."""
    keys = request.query_params.keys()
    repeated = sorted({key for key in keys if len(request.query_params.getlist(key)) > 1})
    if repeated:
        raise InvalidInput(f"{', '.join(repeated)}: give each query parameter once.")
