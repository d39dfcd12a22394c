"""Reusable dependencies: the app state and the verified caller; the query rules."""

from __future__ import annotations

from collections import Counter
from typing import Annotated

from fastapi import Depends, Query, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import QueryParams

from memchat.api.state import AppState
from memchat.auth import Caller
from memchat.config import AGENT_NAME_PATTERN
from memchat.errors import BadRequest, InvalidInput, Unauthorized

# Dependencies are `async def`: FastAPI runs a plain `def` in a worker thread,
# two thread hand-offs per request, which a turn's time to first words pays.


async def get_state(request: Request) -> AppState:
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


async def current_user(
    request: Request,
    state: State,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Caller:
    if credentials is None:
        raise Unauthorized()
    token, verifier = credentials.credentials, state.verifier
    if verifier.needs_key_fetch(token):
        # A blocking HTTP request: in a thread, so other requests go on.
        caller = await run_in_threadpool(verifier.verify, token)
    else:
        caller = verifier.verify(token)  # CPU only: a signature check
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


MAX_QUERY_PARAMETERS = 50
"""The most query parameters a request may have. No endpoint takes more than
three; the rest is room for the ignored ones (cache busters, tracking)."""


class TooManyQueryParameters(BadRequest):
    code = "too_many_query_parameters"
    detail = (
        f"The query string has more than {MAX_QUERY_PARAMETERS} parameters;"
        " no endpoint takes more than a few, so send only those."
    )


def check_query(query_string: bytes) -> None:
    """Refuse a query string with more than MAX_QUERY_PARAMETERS parameters
    (400 `too_many_query_parameters`, counted without parsing them) or with
    a parameter given more than once (422 `validation_error`): no endpoint
    takes a list, and `?limit=5&limit=500` must not quietly mean whichever
    came last. Linear in the query string's length; names are compared as
    the routes see them (percent-decoded, + as a space).
    """
    fields = query_string.split(b"&")
    # What Starlette parses into parameters: the non-empty fields.
    if len(fields) - fields.count(b"") > MAX_QUERY_PARAMETERS:
        raise TooManyQueryParameters()
    counts = Counter(key for key, _ in QueryParams(query_string).multi_items())
    repeated = sorted(key for key, count in counts.items() if count > 1)
    if repeated:
        raise InvalidInput(f"{', '.join(repeated)}: give each query parameter once.")
