"""GET /memory/search: the caller's earlier exchanges best matching a text,
found by the same recall a chat turn uses (served with the chat routes: it
embeds the query with their embeddings client)."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Annotated

from fastapi import APIRouter, Query, Response

from memchat.api.deps import AgentQuery, CurrentUser, State
from memchat.api.schemas import STORABLE_PATTERN, error_responses
from memchat.api.schemas.memory import MemorySearchOut, NeighbourOut, RecalledOut
from memchat.errors import BadRequest, NaiveTime, RecallOff, RecallUnavailable
from memchat.usecases.completions import storable
from memchat.usecases.recall import OK

if TYPE_CHECKING:
    from memchat.store.records import Neighbour

router = APIRouter(tags=["memory"])

MAX_K = 50


_SEARCH_ERRORS = error_responses(
    400,
    409,
    422,
    429,
    503,
    descriptions={
        400: "as_of is not an ISO 8601 time with a time zone (`invalid_as_of`)",
        409: "Memory is off (`recall_disabled`)",
        503: "The query could not be embedded (`recall_unavailable`)",
    },
)


@router.get("/memory/search", response_model=MemorySearchOut, responses=_SEARCH_ERRORS)
async def search_memory(
    caller: CurrentUser,
    state: State,
    response: Response,
    q: Annotated[
        str,
        Query(
            min_length=1,
            max_length=16000,
            json_schema_extra={"pattern": STORABLE_PATTERN},
            description="What to look for.",
        ),
    ],
    k: Annotated[int, Query(ge=1, le=MAX_K, description="At most this many hits.")] = 5,
    agent_name: AgentQuery = "default",
    as_of: Annotated[
        str | None,
        Query(
            max_length=64,
            json_schema_extra={"format": "date-time"},
            description="The moment time expressions in q ('last week', 'in March')"
            " are read against (ISO 8601 with a zone). Default: now.",
        ),
    ] = None,
) -> MemorySearchOut:
    """The caller's earlier exchanges of `agent_name` best matching `q`, under
    RLS, as a chat turn recalls them (meaning and words fused, a time
    expression's period favoured, the similarity floor applied), but over
    every live session, the active one included. `Server-Timing` says how
    long the embedding and the search took."""
    if not q.strip():
        raise BadRequest("q is blank.")
    # The database's text cannot hold a NUL: refused here, naming q, rather
    # than failing in the search (or, as the whole of q, in its embedding).
    storable("q", q)
    moment = _moment(as_of)
    if not state.settings.memory_enabled:
        raise RecallOff
    found = await state.chat.recall.search(caller, q, agent_name=agent_name, k=k, as_of=moment)
    if found.status != OK:
        raise RecallUnavailable
    response.headers["Server-Timing"] = (
        f"recall;dur={found.ms:.2f}, embedding;dur={found.embed_ms:.2f}"
    )
    return MemorySearchOut(
        agent_name=agent_name,
        hits=[
            RecalledOut(
                kind="exchange" if hit.memory_id is None else "memory",
                memory_id=hit.memory_id,
                session_id=str(hit.session_id),
                message_id=hit.message_id,
                created_at=hit.created_at.isoformat(),
                score=hit.score,
                title=hit.title,
                question=hit.question,
                answer=hit.answer,
                before=_neighbour(hit.before),
                after=_neighbour(hit.after),
            )
            for hit in found.hits
        ],
        recall_ms=round(found.ms, 3),
    )


def _neighbour(neighbour: Neighbour | None) -> NeighbourOut | None:
    if neighbour is None:
        return None
    return NeighbourOut(
        message_id=neighbour.message_id, question=neighbour.question, answer=neighbour.answer
    )


def _moment(as_of: str | None) -> datetime | None:
    """as_of: an ISO 8601 time with a zone (a bare number is not one)."""
    if as_of is None:
        return None
    try:
        moment = datetime.fromisoformat(as_of.strip())
    except ValueError:
        raise NaiveTime("as_of is not an ISO 8601 time, e.g. 2023-05-30T23:40:00Z.") from None
    if moment.tzinfo is None:
        raise NaiveTime
    return moment
