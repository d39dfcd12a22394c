"""One chat turn: resolve the session, build the prompt, run the model and
its memory tool, then store the whole turn in one transaction.

Nothing is written before the model has answered, so a model failure or
timeout leaves the database as it was. The steps, in order: `accept` (the
request's own rules), load (one round trip: session, notes, window, summary,
throttle, idempotency), `_remember` (recall and the token budget: a
TurnMemory), converse (usecases/conversation.py), `_turn_to_store` (a
store.Turn), record (the second round trip).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from memchat import messages, store
from memchat.errors import (
    BadRequest,
    DuplicateClientMessage,
    IdempotencyConflict,
    IdempotencyInFlight,
    NotesConflict,
    PayloadTooLarge,
    QuotaExceeded,
    UnknownToolCall,
    UpstreamTimeout,
)
from memchat.model.sampling import DEFAULT as DEFAULT_SAMPLING
from memchat.model.sampling import Sampling
from memchat.prompts.memory import SYSTEM_PROMPT
from memchat.throttle import Bucket, Rate
from memchat.usecases import conversation, prompt
from memchat.usecases.recall import NOT_RECALLED, PendingRecall, Recall, Recalled
from memchat.usecases.recall.search import searcher
from memchat.usecases.suggestions import FollowUps

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from memchat.config import Settings
    from memchat.model import tools
    from memchat.model.client import ModelClient, ToolCall
    from memchat.store.db import Database
    from memchat.usecases.conversation import FindMemories, Outcome
    from memchat.usecases.streaming import TurnListener

logger = logging.getLogger(__name__)

DEFAULT_SYSTEM_PROMPT = SYSTEM_PROMPT
NO_ROUNDS_LEFT = conversation.NO_ROUNDS_LEFT
# The most memories one find_memories call shows the model.
FIND_MEMORIES_LIMIT = 10
_MAX_NOTE_RETRIES = 3
_TITLE_CHARS = 80
# A turn's claim on its client_message_id outlives its deadline by this much,
# so it is recorded before the claim can expire; a crashed turn's claim
# expires then too.
_CLAIM_MARGIN_SECONDS = 10.0
# A retry of a turn in flight polls for the stored answer, backing off.
_IN_FLIGHT_FIRST_PAUSE = 0.05
_IN_FLIGHT_MAX_PAUSE = 1.0
_T = TypeVar("_T")


@dataclass(frozen=True)
class ChatRequest:
    message: str
    session_id: uuid.UUID | None = None
    agent_name: str = "default"
    use_memory: bool = True
    max_history_messages: int | None = None
    client_message_id: str | None = None
    recall_k: int | None = None  # None: MEMORY_RECALL_K
    # Whether the model gets the search_memory tool (None: SEARCH_MEMORY_TOOL).
    search_memory: bool | None = None
    # From POST /v1/chat/completions (usecases/completions.py): the client's
    # own instructions (its system messages), after memchat's system prompt;
    # its tools, offered beside the notes tool; and a continuation: the
    # assistant's call of a client tool and the client's results, after
    # `message` (already stored). Once checked against the stored call
    # (ChatService._continued), `message` and the continuation's first
    # `stored_rounds` messages are the stored turn's, the rest the new results.
    instructions: str = ""
    tools: tuple[dict[str, Any], ...] = ()
    continuation: tuple[dict[str, Any], ...] = ()
    stored_rounds: int = 0
    # How the answer is sampled (max_tokens within OPENAI_MAX_TOKENS, ...).
    sampling: Sampling = DEFAULT_SAMPLING
    # The window, given: a chat the client resent, as memchat stored it
    # (usecases/completions.py), instead of the session's last messages
    # (another chat may share the session); no summary then. None: the
    # session's own.
    window: tuple[dict[str, Any], ...] | None = None
    # Suggested follow-ups with the answer (None: SUGGESTIONS decides).
    suggest: bool | None = None


def one_session_id(named: Iterable[tuple[str, uuid.UUID | None]]) -> uuid.UUID | None:
    """The session a request names, from every place it may name one (each
    `(where, id)`): they must agree (400 naming the places), None when none does."""
    given = [(where, sid) for where, sid in named if sid is not None]
    if len({sid for _, sid in given}) > 1:
        places = " and ".join(where for where, _ in given)
        raise BadRequest(f"{places} name different sessions.")
    return given[0][1] if given else None


@dataclass
class ChatResult:
    answer: str
    session_id: uuid.UUID
    agent_name: str
    model: str
    usage: dict[str, int]
    memory: dict[str, Any]
    session: store.SessionInfo | None
    replayed: bool = False
    timings: dict[str, float] = field(default_factory=dict)
    # The stored answer's and user message's ids (None when nothing is stored).
    message_id: int | None = None
    user_message_id: int | None = None
    # Calls of the client's tools the turn ended with (POST /v1/chat/completions).
    tool_calls: list[ToolCall] = field(default_factory=list)
    # Suggested follow-ups (usecases/suggestions.py; None: not asked for), or,
    # for a streamed turn, the task making them (sent after the answer).
    suggestions: list[str] | None = None
    pending_suggestions: asyncio.Task[list[str]] | None = field(default=None, repr=False)


@dataclass(frozen=True)
class TurnMemory:
    """What a turn loaded and recalled, fitted into its prompt's budget."""

    session_id: uuid.UUID  # the turn's session (new ones get their id here)
    agent_name: str
    notes: store.Notes  # as loaded (their version is the one the turn edits)
    recalled: Recalled  # what recall found; `fitted.hits` are those used
    fitted: prompt.MemoryPrompt
    summary_covers_until: int | None  # the summary used, if one was
    retrieval_ms: float

    def prompt(self, system_prompt: str, message: str) -> list[dict[str, Any]]:
        """The model's prompt: the system prompt, memory, the new message."""
        return [
            {"role": "system", "content": system_prompt},
            *self.fitted.messages(),
            {"role": "user", "content": message},
        ]

    def metadata(
        self, *, notes_updated: bool = False, searches: list[dict[str, Any]] | None = None
    ) -> dict[str, Any]:
        """The response's `memory` (`searches`: the turn's search_memory calls)."""
        return _memory(
            enabled=True,
            retrieval_ms=self.retrieval_ms,
            messages_in_context=len(self.fitted.window),
            notes_used=bool(self.fitted.notes),
            notes_updated=notes_updated,
            truncated=self.fitted.truncated,
            context_tokens=self.fitted.tokens,
            recalled=dataclasses.replace(self.recalled, hits=self.fitted.hits),
            summary_covers_until=self.summary_covers_until,
            searches=searches or [],
        )


@dataclass
class ChatService:
    db: Database
    model: ModelClient
    settings: Settings
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    # Called with every answered turn (metrics: timings, tokens); a failing
    # observer is logged and never fails the turn.
    on_turn: Callable[[ChatResult], None] | None = None
    recall: Recall = field(init=False)
    _ttl_warned: bool = field(default=False, init=False, repr=False)

    def __post_init__(self) -> None:
        self.recall = Recall(self.db, self.model, self.settings)

    def accept(self, request: ChatRequest) -> ChatRequest:
        """The request, if its message may be sent: 413 over MAX_MESSAGE_CHARS,
        400 when it has no text."""
        limit = self.settings.max_message_chars
        if len(request.message) > limit:
            raise PayloadTooLarge(
                f"message is {len(request.message)} characters; the limit is {limit}."
            )
        if not request.message.strip():
            raise BadRequest("message is empty or only whitespace; send some text.")
        return request

    async def run(
        self,
        caller: store.Caller,
        request: ChatRequest,
        listener: TurnListener | None = None,
    ) -> ChatResult:
        """One turn. A `listener` hears it as it happens (streaming): its
        memory once loaded, the answer's pieces, the notes' changes."""
        result = await self._run(caller, self.accept(request), listener)
        if self.on_turn is not None:
            try:
                self.on_turn(result)
            except Exception:
                logger.exception("turn observer failed")
        return result

    async def _run(
        self, caller: store.Caller, request: ChatRequest, listener: TurnListener | None
    ) -> ChatResult:
        deadline = asyncio.get_running_loop().time() + self.settings.turn_timeout_seconds
        if not (self.settings.memory_enabled and request.use_memory):
            return await self._run_without_memory(caller, request, deadline, listener)
        k = self.settings.memory_recall_k if request.recall_k is None else request.recall_k
        # The embedding is made while the context loads (see usecases/recall/service.py);
        # the load is a task scheduled after the embedding's, so the embedding
        # request (the longer wait) leaves first. A turn with a client_message_id
        # may be a retry whose answer is stored: its context comes first (one
        # round trip, a few ms), so a replay makes no embedding call at all.
        early = None if request.client_message_id else self.recall.start(request.message, k)
        started = time.perf_counter()
        try:
            context = await asyncio.create_task(self._load(caller, request, deadline))
        except BaseException:
            if early is not None:
                early.cancel()
            raise
        retrieval_ms = (time.perf_counter() - started) * 1000
        try:
            stored = await self._stored(caller, request, context, retrieval_ms)
        except BaseException:
            await self._give_up(caller, request, context)
            raise
        if stored is not None:
            assert early is None  # only a turn with a client_message_id has a replay
            await self._give_up(caller, request, context)
            return await _replay(stored, listener)
        pending = early or self.recall.start(request.message, k)
        try:
            return await self._answer(
                caller, request, context, pending, deadline, retrieval_ms, listener
            )
        except BaseException:
            pending.cancel()
            await self._give_up(caller, request, context)
            raise

    async def _stored(
        self,
        caller: store.Caller,
        request: ChatRequest,
        context: store.Context,
        retrieval_ms: float,
    ) -> ChatResult | None:
        """A retry's stored turn, replayed (None: not stored). load_context finds
        the answer of a turn without the client's tools itself; a turn that may
        have ended with a call of them, or that continues one, is looked up by
        its end: the answer, or the call (store.stored_turn)."""
        key = request.client_message_id
        if key and (request.tools or request.continuation) and context.session is not None:
            found = await store.stored_turn(
                self.db,
                caller,
                session_id=context.session.id,
                client_message_id=key,
                own_tools=conversation.OWN_TOOLS,
            )
            if found is not None:
                keyed, replay = found
                if keyed != ("tool" if request.continuation else "human"):
                    raise IdempotencyConflict()  # the key is on another kind of request
                return _replayed(
                    context.session, replay, retrieval_ms, continuation=bool(request.continuation)
                )
        if context.replay is None:
            return None
        assert context.session is not None
        return _replayed(context.session, context.replay, retrieval_ms)

    async def _give_up(
        self, caller: store.Caller, request: ChatRequest, context: store.Context
    ) -> None:
        """Release the claim load_context took on the client_message_id, if it
        took one (a turn that failed, or found its answer stored after all)."""
        if context.claimed and request.client_message_id:
            await self._release_claim(caller, request.client_message_id)

    @property
    def _throttle(self) -> Rate:
        return self.db.limits.rate(Bucket.CHAT)

    async def _load(
        self, caller: store.Caller, request: ChatRequest, deadline: float
    ) -> store.Context:
        """The turn's context; while another request answers the same
        client_message_id, wait (up to the turn's deadline) for its answer."""
        loop = asyncio.get_running_loop()
        pause = _IN_FLIGHT_FIRST_PAUSE
        while True:
            try:
                return await store.load_context(
                    self.db,
                    caller,
                    session_id=request.session_id,
                    agent_name=request.agent_name,
                    window=0 if request.window is not None else self._window(request),
                    client_message_id=request.client_message_id,
                    message=self._keyed_text(request),
                    throttle=self._throttle,
                    claim_seconds=self.settings.turn_timeout_seconds + _CLAIM_MARGIN_SECONDS,
                    read_max=0 if request.window is not None else self._read_max(request),
                )
            except IdempotencyInFlight:
                if loop.time() + pause > deadline:
                    raise
                await asyncio.sleep(pause)
                pause = min(pause * 2, _IN_FLIGHT_MAX_PAUSE)

    def _keyed_text(self, request: ChatRequest) -> str:
        """The text a retry must bring with its client_message_id: that of the
        message the key is stored on, the turn's first new one (the user
        message, or a continuation's first tool result)."""
        return messages.text_of(self._new_messages(request)[0])

    def _offers_search(self, request: ChatRequest) -> bool:
        """Whether the model gets search_memory: the request's choice, else
        SEARCH_MEMORY_TOOL."""
        if request.search_memory is None:
            return self.settings.search_memory_tool
        return request.search_memory

    def _window(self, request: ChatRequest) -> int:
        return request.max_history_messages or self.settings.memory_max_history_messages

    def _read_max(self, request: ChatRequest) -> int:
        """How far back a turn reads to reach the summary: the worker summarizes
        what leaves its window (MEMORY_MAX_HISTORY_MESSAGES), and a session is
        queued once SUMMARY_TRIGGER_MESSAGES more are outside the summary, so
        this many messages reach back to a summary that is up to date."""
        settings = self.settings
        return max(
            self._window(request),
            settings.memory_max_history_messages + settings.summary_trigger_messages,
        )

    async def _answer(
        self,
        caller: store.Caller,
        request: ChatRequest,
        context: store.Context,
        pending: PendingRecall,
        deadline: float,
        retrieval_ms: float,
        listener: TurnListener | None,
    ) -> ChatResult:
        """Recall, fit memory to the budget, run the model and store the turn."""
        limits = context.limits
        assert limits is not None
        request = await self._admitted(caller, request, context, limits)
        memory = await self._remember(caller, request, context, pending, deadline, retrieval_ms)
        if listener is not None:
            await listener.started(memory.session_id, memory.agent_name, memory.metadata())
        follow_ups = None
        if self._suggests(request):
            follow_ups = FollowUps.begin(
                self.model, memory.fitted.window, request.message, streamed=listener is not None
            )
        notes_limit = min(self.settings.ltm_max_chars, limits.max_notes_chars)
        model_started = time.perf_counter()
        try:
            outcome = await self._with_deadline(
                deadline,
                conversation.converse(
                    self.model,
                    self._prompt(memory, request),
                    notes=memory.notes.notes,
                    notes_limit=notes_limit,
                    max_rounds=self.settings.max_tool_rounds,
                    listener=listener,
                    client_tools=request.tools,
                    search=searcher(self.recall, caller, memory.agent_name)
                    if self._offers_search(request)
                    else None,
                    sampling=request.sampling,
                    find_memories=self._memory_finder(caller, memory.agent_name),
                ),
            )
            model_ms = (time.perf_counter() - model_started) * 1000
            result = await self._store(
                caller, request, context, memory, outcome, pending, notes_limit, model_ms
            )
        except BaseException:
            if follow_ups is not None:
                follow_ups.cancel()
            raise
        if follow_ups is not None and not result.replayed:
            result.suggestions, result.pending_suggestions = await follow_ups.settle(
                outcome.answer, ended_with_calls=bool(outcome.client_calls)
            )
        return result

    async def _admitted(
        self,
        caller: store.Caller,
        request: ChatRequest,
        context: store.Context,
        limits: store.Limits,
    ) -> ChatRequest:
        """The request, if the database's limits let it be stored (413 over
        max_message_chars, or past the user's stored messages: before the
        model is called), a continuation as memchat stored it."""
        if len(request.message) > limits.max_message_chars:
            raise PayloadTooLarge(
                f"message is {len(request.message)} characters;"
                f" the limit is {limits.max_message_chars}."
            )
        adding = len(self._new_messages(request)) + 1  # and the answer, at least
        if limits.stored_messages + adding > limits.max_stored_messages:
            raise QuotaExceeded(limits.max_stored_messages, limits.stored_messages, adding)
        if request.continuation:
            return await self._continued(caller, request, context)
        return request

    async def _store(
        self,
        caller: store.Caller,
        request: ChatRequest,
        context: store.Context,
        memory: TurnMemory,
        outcome: Outcome,
        pending: PendingRecall,
        notes_limit: int,
        model_ms: float,
    ) -> ChatResult:
        """Store the answered turn (with its embedding); the turn's result."""
        messages.annotate_answer(
            outcome.answer_message,
            latency_ms=model_ms,
            recalled=len(memory.fitted.hits),
            summary_used=memory.summary_covers_until is not None,
        )
        if outcome.searches:
            outcome.answer_message["data"]["response_metadata"]["memchat"]["search_memory"] = (
                outcome.searches
            )
        limits = context.limits
        assert limits is not None
        turn = self._turn_to_store(request, context, memory, outcome, limits)
        if not request.continuation:  # a continuation's user message is stored already
            turn.embedding = await pending.embedding_to_store(caller, memory.recalled)
        record_started = time.perf_counter()
        try:
            session = await self._record(caller, turn, outcome.edits, notes_limit)
        except DuplicateClientMessage:
            # A concurrent retry with the same client_message_id was stored first.
            retrieval_ms = memory.retrieval_ms
            return await self._stored_answer(caller, request, memory.session_id, retrieval_ms)
        timings = {
            "retrieval_ms": memory.retrieval_ms,
            "recall_ms": memory.recalled.ms,
            "model_ms": model_ms,
            "record_ms": (time.perf_counter() - record_started) * 1000,
        }
        _log_stored(session, memory, turn, outcome, timings)
        return ChatResult(
            answer=outcome.answer,
            session_id=session.id,
            agent_name=memory.agent_name,
            model=outcome.model,
            usage=outcome.usage,
            memory=memory.metadata(notes_updated=bool(outcome.edits), searches=outcome.searches),
            session=session,
            timings=timings,
            user_message_id=None if request.continuation else session.message_ids[0],
            message_id=session.message_ids[-1],
            tool_calls=outcome.client_calls,
        )

    def _suggests(self, request: ChatRequest) -> bool:
        """Whether the answer carries suggested follow-ups: the request's
        `suggest`, else SUGGESTIONS."""
        return self.settings.suggestions if request.suggest is None else request.suggest

    def _prompt(self, memory: TurnMemory, request: ChatRequest) -> list[dict[str, Any]]:
        return _with_client_parts(memory.prompt(self.system_prompt, request.message), request)

    async def _remember(
        self,
        caller: store.Caller,
        request: ChatRequest,
        context: store.Context,
        pending: PendingRecall,
        deadline: float,
        retrieval_ms: float,
    ) -> TurnMemory:
        """Finish recall and fit notes, recalled exchanges, summary and window
        into MEMORY_MAX_CONTEXT_TOKENS."""
        session = context.session
        agent_name = session.agent_name if session else request.agent_name
        notes = context.notes or store.Notes(agent_name, "", 0, None)
        summary = context.summary
        window = context.messages
        if request.window is not None:
            window, summary = list(request.window)[-self._window(request) :], None
        recalled = await self._with_deadline(
            deadline,
            pending.finish(
                caller,
                session_id=session.id if session else request.session_id,
                agent_name=agent_name,
                window=self._window(request),
                previous=window,
            ),
        )
        if request.continuation and request.window is None:
            # The turn being continued (its user message on) comes from the request.
            starts = [i for i, m in enumerate(window) if m.get("type") == "human"]
            window = window[: starts[-1]] if starts else window
        fitted = self._fit(notes.notes, recalled.hits, window, summary)
        return TurnMemory(
            session_id=session.id if session else request.session_id or uuid.uuid4(),
            agent_name=agent_name,
            notes=notes,
            recalled=recalled,
            fitted=fitted,
            summary_covers_until=summary.covers_until if summary and fitted.summary else None,
            retrieval_ms=retrieval_ms,
        )

    def _turn_to_store(
        self,
        request: ChatRequest,
        context: store.Context,
        memory: TurnMemory,
        outcome: Outcome,
        limits: store.Limits,
    ) -> store.Turn:
        """What the turn stores: the user message, the model's messages, the
        notes if they were edited; the embedding is added once it is ready."""
        return store.Turn(
            session_id=memory.session_id,
            agent_name=memory.agent_name,
            messages=[*self._new_messages(request), *outcome.messages],
            title=_title(request.message),
            ttl=self._ttl(limits),
            client_message_id=request.client_message_id,
            notes=outcome.notes if outcome.edits else None,
            notes_version=memory.notes.version,
            new_session=context.session is None and request.session_id is None,
            summary_due_after=self._window(request) + self.settings.summary_trigger_messages,
            forget_memory_ids=list(outcome.forgotten),
        )

    def _memory_finder(self, caller: store.Caller, agent_name: str) -> FindMemories:
        """The memory tool's find_memories for this turn: the caller's
        memories matching a text, as GET /memories?q= finds them."""
        from memchat.usecases.memories import memories_matching

        async def find(about: str) -> list[tuple[int, str, str, str]]:
            found = await memories_matching(
                self.db,
                self.recall,
                self.settings,
                caller,
                agent_name=agent_name,
                text=about[:16000],
                limit=FIND_MEMORIES_LIMIT,
            )
            return [(m.id, m.text, m.created_at.isoformat(), m.kind) for m in found]

        return find

    async def _continued(
        self, caller: store.Caller, request: ChatRequest, context: store.Context
    ) -> ChatRequest:
        """The continuation as memchat stored it: the session's last turn must
        end with a call of the client's tools that memchat made and whose
        results are not stored yet, and the request must bring a result for
        each of those calls (400 `unknown_tool_call` otherwise, nothing sent
        or stored). The model is then sent the stored user message and rounds,
        then the new results, never the client's copy of them."""
        session = context.session
        live = session is not None and session.expires_at > datetime.now(UTC)
        turn = await store.open_turn(self.db, caller, session.id) if live and session else []
        last = max(i for i, m in enumerate(request.continuation) if m["role"] == "assistant")
        asked = [call["id"] for call in request.continuation[last].get("tool_calls") or ()]
        # open_turn returns a turn only when its last assistant message is a call.
        call = max((i for i, m in enumerate(turn) if m.get("type") == "ai"), default=len(turn))
        made = [c["id"] for c in turn[call]["data"]["tool_calls"]] if turn else []
        answered = {m["data"].get("tool_call_id") for m in turn[call + 1 :]}
        pending = [c for c in made if c not in answered]
        if not pending or set(asked) != set(pending):
            unknown = next((c for c in asked if c not in pending), None)
            raise UnknownToolCall(
                "messages: "
                + (
                    f"memchat made no call {unknown[:64]!r} awaiting a result in this session"
                    if unknown is not None
                    else f"the call {sorted(set(pending) - set(asked))[0][:64]!r} awaits a result"
                )
                + "; continue the last assistant message memchat sent, with one tool"
                " message per call."
            )
        results = request.continuation[last + 1 :]
        rounds = tuple(conversation.prompt_round(m) for m in turn[1:])
        return dataclasses.replace(
            request,
            message=messages.text_of(turn[0]),
            continuation=(*rounds, *results),
            stored_rounds=len(rounds),
        )

    @staticmethod
    def _new_messages(request: ChatRequest) -> list[dict[str, Any]]:
        """What the turn stores before the model's messages: the user message,
        or a continuation's tool results (its user message is stored already)."""
        if not request.continuation:
            return [messages.human(request.message)]
        if request.stored_rounds:
            calls = request.continuation[: request.stored_rounds]
            results = request.continuation[request.stored_rounds :]
        else:
            # Only the results after the last assistant message are new: earlier
            # rounds of the continuation were stored by the requests that made them.
            last = max(i for i, m in enumerate(request.continuation) if m["role"] == "assistant")
            calls = request.continuation[last : last + 1]
            results = request.continuation[last + 1 :]
        names = {
            call["id"]: call["function"]["name"]
            for message in calls
            for call in message.get("tool_calls") or ()
        }
        return [
            messages.tool(
                str(m["content"]),
                tool_call_id=str(m["tool_call_id"]),
                name=names.get(m["tool_call_id"], ""),
            )
            for m in results
        ]

    def _ttl(self, limits: store.Limits) -> timedelta:
        """SESSION_TTL_HOURS, within the database's maximum (which would clamp it anyway)."""
        ttl = timedelta(hours=self.settings.session_ttl_hours)
        if ttl > limits.max_session_ttl:
            if not self._ttl_warned:
                self._ttl_warned = True
                logger.warning(
                    "SESSION_TTL_HOURS is above the database's maximum session TTL;"
                    " sessions expire after the maximum (raise memchat.limits.max_session_ttl)",
                    extra={
                        "session_ttl_hours": self.settings.session_ttl_hours,
                        "max_session_ttl_hours": limits.max_session_ttl.total_seconds() / 3600,
                    },
                )
            return limits.max_session_ttl
        return ttl

    async def _with_deadline(self, deadline: float, work: Awaitable[_T]) -> _T:
        """`work`, or 504 when the turn's deadline passes first (nothing is stored)."""
        try:
            async with asyncio.timeout_at(deadline):
                return await work
        except TimeoutError:
            budget = self.settings.turn_timeout_seconds
            raise UpstreamTimeout(
                f"The model did not finish the turn within {budget:g} s; nothing was stored."
            ) from None

    async def _stored_answer(
        self, caller: store.Caller, request: ChatRequest, session_id: uuid.UUID, ms: float
    ) -> ChatResult:
        context = await store.load_context(
            self.db,
            caller,
            session_id=session_id,
            agent_name=request.agent_name,
            window=1,
            read_notes=False,
            client_message_id=request.client_message_id,
            message=self._keyed_text(request),
        )
        try:
            stored = await self._stored(caller, request, context, ms)
        finally:
            await self._give_up(caller, request, context)
        if stored is None:
            raise DuplicateClientMessage()
        return stored

    async def _release_claim(self, caller: store.Caller, client_message_id: str) -> None:
        """Let a retry of a failed turn run at once (else the claim just expires)."""
        try:
            await asyncio.shield(store.release_claim(self.db, caller, client_message_id))
        except Exception:
            logger.warning("could not release a turn claim; it expires on its own")

    async def _run_without_memory(
        self,
        caller: store.Caller,
        request: ChatRequest,
        deadline: float,
        listener: TurnListener | None,
    ) -> ChatResult:
        # Nothing is read into the prompt, but a deleted account is refused
        # (401) and the throttle applies.
        await store.load_context(
            self.db,
            caller,
            session_id=request.session_id,
            agent_name=request.agent_name,
            window=0,
            read_notes=False,
            throttle=self._throttle,
        )
        prompt_ = _with_client_parts(
            [
                {"role": "system", "content": self.system_prompt},
                {"role": "user", "content": request.message},
            ],
            request,
        )
        session_id = request.session_id or uuid.uuid4()
        if listener is not None:
            await listener.started(session_id, request.agent_name, _memory(enabled=False))
        started = time.perf_counter()
        completion = await self._with_deadline(
            deadline,
            conversation.complete(
                self.model,
                prompt_,
                list(request.tools) or None,
                listener=listener,
                sampling=request.sampling,
            ),
        )
        return ChatResult(
            answer=completion.content,
            session_id=session_id,
            agent_name=request.agent_name,
            model=completion.model,
            usage=_usage(completion.usage),
            memory=_memory(enabled=False),
            session=None,
            timings={"model_ms": (time.perf_counter() - started) * 1000},
            tool_calls=completion.tool_calls,
        )

    def _fit(
        self,
        notes: str,
        hits: list[store.Hit],
        stored: list[dict[str, Any]],
        summary: store.Summary | None,
    ) -> prompt.MemoryPrompt:
        """Notes, recalled exchanges, the summary and the window within
        MEMORY_MAX_CONTEXT_TOKENS."""
        from memchat.model.tokens import counter_for_model

        window = [m for m in (messages.to_openai(s) for s in stored) if m is not None]
        return prompt.fit(
            counter_for_model(self.model.model),
            budget=self.settings.memory_max_context_tokens,
            notes=notes,
            hits=hits,
            window=window,
            summary=summary.text if summary else "",
            max_window_chars=self.settings.memory_max_context_chars,
        )

    async def _record(
        self,
        caller: store.Caller,
        turn: store.Turn,
        edits: list[tools.NoteEdit],
        notes_limit: int,
    ) -> store.SessionInfo:
        """Store the turn; if the notes moved meanwhile, replay our edits on the new ones."""
        for attempt in range(_MAX_NOTE_RETRIES + 1):
            try:
                return await store.record_turn(self.db, caller, turn)
            except NotesConflict:
                if attempt == _MAX_NOTE_RETRIES:
                    raise
                latest = await store.read_notes(self.db, caller, turn.agent_name)
                text = latest.notes
                for edit in edits:
                    try:
                        text = edit.apply(text)
                    except ValueError:
                        continue  # e.g. the section it deleted is already gone
                turn.notes = text[:notes_limit]
                turn.notes_version = latest.version
        raise AssertionError("unreachable")


def _with_client_parts(prompt_: list[dict[str, Any]], request: ChatRequest) -> list[dict[str, Any]]:
    """memchat's prompt (its system prompt first, the user message last) with
    the client's instructions after the system prompt and a continuation
    after the user message."""
    if request.instructions:
        prompt_.insert(1, {"role": "system", "content": request.instructions})
    return [*prompt_, *request.continuation]


def _log_stored(
    session: store.SessionInfo,
    memory: TurnMemory,
    turn: store.Turn,
    outcome: Outcome,
    timings: dict[str, float],
) -> None:
    """The turn's log line: ids, counts and timings, never text."""
    logger.info(
        "chat turn stored",
        extra={
            "session_id": str(session.id),
            "agent_name": memory.agent_name,
            "messages_stored": len(turn.messages),
            "tool_rounds": outcome.rounds,
            "recall_status": memory.recalled.status,
            "recalled": len(memory.recalled.hits),
            "context_tokens": memory.fitted.tokens,
            **{key: round(value, 2) for key, value in timings.items()},
        },
    )


def _memory(
    *,
    enabled: bool,
    retrieval_ms: float = 0.0,
    messages_in_context: int = 0,
    notes_used: bool = False,
    notes_updated: bool = False,
    truncated: bool = False,
    context_tokens: int = 0,
    recalled: Recalled = NOT_RECALLED,
    summary_covers_until: int | None = None,
    searches: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The response's `memory` metadata."""
    return {
        "enabled": enabled,
        "messages_in_context": messages_in_context,
        "long_term_notes_used": notes_used,
        "long_term_notes_updated": notes_updated,
        "context_truncated": truncated,
        "retrieval_ms": round(retrieval_ms, 3),
        "context_tokens": context_tokens,
        "recall_ms": round(recalled.ms, 3),
        "recall_status": recalled.status,
        "recalled": recalled.as_list(),
        "summary_used": summary_covers_until is not None,
        "summary_covers_until": summary_covers_until,
        "search_memory": searches or [],
    }


def _usage(usage: dict[str, int]) -> dict[str, int]:
    return {
        "prompt_tokens": usage.get("prompt_tokens", 0),
        "completion_tokens": usage.get("completion_tokens", 0),
    }


def _title(message: str) -> str:
    line = " ".join(message.split())
    return line if len(line) <= _TITLE_CHARS else line[: _TITLE_CHARS - 1] + "…"


async def _replay(result: ChatResult, listener: TurnListener | None) -> ChatResult:
    """A stored answer, told to the listener as one piece."""
    if listener is not None:
        await listener.started(result.session_id, result.agent_name, result.memory)
        await listener.delta(result.answer)
    return result


def _replayed(
    session: store.SessionInfo,
    replay: store.Replay,
    retrieval_ms: float,
    *,
    continuation: bool = False,
) -> ChatResult:
    """A stored turn's end as the turn's result: its answer, or its call of
    the client's tools (`continuation`: it continued a stored user message)."""
    from memchat.model.client import ToolCall

    data = replay.message.get("data", {})
    usage = data.get("usage_metadata") or {}
    return ChatResult(
        answer=messages.text_of(replay.message),
        session_id=session.id,
        agent_name=session.agent_name,
        model=(data.get("response_metadata") or {}).get("model_name", ""),
        usage={
            "prompt_tokens": usage.get("input_tokens", 0),
            "completion_tokens": usage.get("output_tokens", 0),
        },
        memory=_memory(enabled=True, retrieval_ms=retrieval_ms),
        session=session,
        replayed=True,
        message_id=replay.message_id,
        user_message_id=None if continuation else replay.user_message_id,
        tool_calls=[
            ToolCall(call["id"], call["name"], conversation.call_arguments(call))
            for call in data.get("tool_calls") or ()
        ],
    )
