"""History import: a user's conversations from a file, with their original times.

What an import reads (`read_document`), one JSON document of either form:

- `{"sessions": [...], "long_term_memory": [...]}`: memchat's own account
  export (GET /export; its other fields are read and ignored) and the plain
  shape, `{"sessions": [{"id"?, "agent_name"?, "title"?, "messages":
  [{"role": "user" | "assistant", "content", "created_at"}]}]}`;
- `{"session": {...}, "messages": [...]}`: one session's export (GET
  /chat/export/{id}).

(`memchat import` reads the exports' NDJSON forms too, as these.) Messages
keep what the export shows of them (role, content, created_at, tool calls and
results, usage and model, client_message_id, the answer's feedback), each
session its agent, title, status, times and rolling summary; the account's
notes are imported for agents the caller has none for (never over existing
notes; their earlier versions are not imported: only the database writes
that history). So an export imported into an empty account exports again as
it was, message ids aside.

How a request is read (`read_body`): its token is taken first (the route
calls store.start_import before it reads the body, so a throttled request
costs next to nothing), then the JSON is parsed and validated off the event
loop, one request at a time per process, so other requests are answered
meanwhile.

How it is stored (`import_history`): under the caller's row-level security,
in transactions of about TRANSACTION_MESSAGES messages (whole sessions: a
session is never split), one round trip each. A session's key is its id:
the one the file gives or, when it gives none, one derived from the session's
content, so a session the caller already has is skipped with all its
messages, and importing a file twice stores nothing twice (an expired
session is gone for every purpose: one with the same id imports anew). That
makes a retry safe: when a request fails partway (the transactions before
the failure are kept), the caller sends the same request again, and only
what is missing is stored. The first transaction checks the caller's quota
(USER_MAX_STORED_MESSAGES) for the whole request: refused, nothing is
stored. Imported sessions expire SESSION_TTL_HOURS after the import,
whatever their dates, and are never made the agent's active session.
Imported messages may be longer than a new turn's (IMPORT_MAX_MESSAGE_CHARS,
not MAX_MESSAGE_CHARS): they are only stored, never sent as a new turn.

Their user messages get embeddings later, from the backfill worker: each
transaction's sessions are queued for it (store.queue_embeddings), and the
result says how many messages still wait (recall finds a message once it is
embedded).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import threading
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    PlainValidator,
    ValidationError,
    WithJsonSchema,
)
from pydantic_core import ErrorDetails, PydanticCustomError

from memchat import messages, store
from memchat.config import AGENT_NAME_PATTERN
from memchat.errors import InvalidInput, PayloadTooLarge
from memchat.packing import packed

if TYPE_CHECKING:
    from memchat.config import Settings

# Messages stored per transaction, about (whole sessions, so a session
# larger than this is a transaction of its own, within
# IMPORT_MAX_MESSAGES_PER_SESSION).
TRANSACTION_MESSAGES = 5000
# The ids of sessions the file names none for: uuid5 of their content's digest.
CONTENT_IDS = uuid.UUID("6d656d63-6861-5469-8d70-6f7274656401")
_TITLE_CHARS = 80  # as a chat turn titles a new session (usecases/chat.py)
_SHOWN_ERRORS = 5
INT8_MAX = 2**63 - 1
TOKENS_MAX = 2**31 - 1

# ---------------------------------------------------------------- the document

ZONED_TIME = "not an ISO 8601 time with a zone, e.g. 2024-05-01T09:30:00Z"
UNSTORABLE = (
    "must not contain NUL (U+0000) or unpaired surrogates (U+D800 to U+DFFF);"
    " send well-formed Unicode"
)
# What _storable allows, said in the schema too (as api/schemas' StoredText).
STORABLE_PATTERN = "^[^\\u0000\\ud800-\\udfff]*$"


def _zoned_time(value: object) -> datetime:
    """An ISO 8601 time with a zone, as the instant in UTC: Python reads
    offsets up to 23:59, PostgreSQL's timestamptz only up to 15:59 (a time
    with a larger one would fail as it is stored)."""
    if isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value)
            if parsed.tzinfo is not None:
                return parsed.astimezone(UTC)
        except (ValueError, OverflowError):  # not a time; or past year 1..9999 in UTC
            pass
    raise PydanticCustomError("zoned_time", ZONED_TIME)


def _session_id(value: object) -> uuid.UUID:
    if isinstance(value, str):
        try:
            return uuid.UUID(value.strip())
        except ValueError:
            pass
    raise PydanticCustomError("uuid", "not a UUID, e.g. 123e4567-e89b-12d3-a456-426614174000")


def _storable(value: object) -> object:
    """Refuses what PostgreSQL cannot store in text or jsonb (NUL, lone
    surrogates), anywhere in a JSON value: keys and strings."""
    if messages.unstorable(value) is not None:
        raise PydanticCustomError("unstorable_text", UNSTORABLE)
    return value


def _text(value: object) -> str:
    if not isinstance(value, str):
        raise PydanticCustomError("string_type", "must be a string")
    _storable(value)
    return value


def _text_within(min_length: int, max_length: int) -> Any:
    """_text of `min_length` to `max_length` characters."""

    def check(value: object) -> str:
        text = _text(value)
        if not min_length <= len(text) <= max_length:
            raise PydanticCustomError(
                "string_length", f"must be {min_length} to {max_length} characters long"
            )
        return text

    return check


def _text_schema(min_length: int = 0, max_length: int | None = None) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string", "pattern": STORABLE_PATTERN}
    if min_length:
        schema["minLength"] = min_length
    if max_length is not None:
        schema["maxLength"] = max_length
    return schema


def _integer(least: int, most: int) -> Any:
    """A JSON integer from `least` to `most` (1.0 is one too, as JSON Schema
    says; true is not)."""

    def check(value: object) -> int:
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if type(value) is not int:
            raise PydanticCustomError("int_type", "must be an integer")
        if not least <= value <= most:
            raise PydanticCustomError("int_range", f"must be from {least} to {most}")
        return value

    return check


def _integer_schema(least: int, most: int) -> dict[str, Any]:
    return {"type": "integer", "minimum": least, "maximum": most}


def _token_counts(value: object) -> dict[str, int]:
    """A usage's details: token counts by name."""
    count = _integer(0, TOKENS_MAX)
    return {name: count(n) for name, n in _json_object(value).items()}


def _json_object(value: object) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise PydanticCustomError("dict_type", "must be a JSON object")
    _storable(value)
    return value


ZonedTime = Annotated[
    datetime,
    PlainValidator(_zoned_time),
    WithJsonSchema({"type": "string", "format": "date-time"}),
]
SessionId = Annotated[
    uuid.UUID, PlainValidator(_session_id), WithJsonSchema({"type": "string", "format": "uuid"})
]
Text = Annotated[str, PlainValidator(_text), WithJsonSchema(_text_schema())]
Title = Annotated[str, PlainValidator(_text_within(0, 200)), WithJsonSchema(_text_schema(0, 200))]
Comment = Annotated[
    str, PlainValidator(_text_within(0, 2000)), WithJsonSchema(_text_schema(0, 2000))
]
ClientMessageId = Annotated[
    str, PlainValidator(_text_within(1, 128)), WithJsonSchema(_text_schema(1, 128))
]
TokenCounts = Annotated[
    dict[str, int],
    PlainValidator(_token_counts),
    WithJsonSchema(
        {
            "type": "object",
            "additionalProperties": _integer_schema(0, TOKENS_MAX),
        }
    ),
]
JsonObject = Annotated[
    dict[str, JsonValue], PlainValidator(_json_object), WithJsonSchema({"type": "object"})
]
AgentName = Annotated[str, Field(pattern=AGENT_NAME_PATTERN)]
TokenCount = Annotated[
    int, PlainValidator(_integer(0, TOKENS_MAX)), WithJsonSchema(_integer_schema(0, TOKENS_MAX))
]
ExportedId = Annotated[
    int, PlainValidator(_integer(1, INT8_MAX)), WithJsonSchema(_integer_schema(1, INT8_MAX))
]
Rating = Annotated[
    int, PlainValidator(_integer(-1, 1)), WithJsonSchema({"type": "integer", "enum": [-1, 0, 1]})
]
Ignored = Annotated[JsonValue, Field(description="Read and ignored (an export's own).")]


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class ToolCall(_Record):
    id: Text
    name: Text
    args: JsonObject
    type: Literal["tool_call"] = "tool_call"


class Usage(_Record):
    """The answer's token usage (LangChain's usage_metadata)."""

    input_tokens: TokenCount
    output_tokens: TokenCount
    total_tokens: TokenCount
    input_token_details: TokenCounts | None = None
    output_token_details: TokenCounts | None = None


class UserMetadata(_Record):
    client_message_id: ClientMessageId | None = Field(
        default=None, description="The chat turn's idempotency key."
    )


class AssistantMetadata(_Record):
    tool_calls: list[ToolCall] | None = None
    usage: Usage | None = None
    model: Text | None = None


class ToolMetadata(_Record):
    tool_call_id: Text
    name: Text | None = None


class Feedback(_Record):
    rating: Rating
    comment: Comment | None = None
    created_at: ZonedTime | None = None
    updated_at: ZonedTime | None = None


class _Message(_Record):
    id: ExportedId | None = Field(
        default=None, description="The exported id: only summary_covers_until refers to it."
    )
    content: Text
    created_at: ZonedTime


class UserMessage(_Message):
    role: Literal["user"]
    metadata: UserMetadata | None = None


class AssistantMessage(_Message):
    role: Literal["assistant"]
    metadata: AssistantMetadata | None = None
    feedback: Feedback | None = None


class ToolMessage(_Message):
    role: Literal["tool"]
    metadata: ToolMetadata


Message = Annotated[UserMessage | AssistantMessage | ToolMessage, Field(discriminator="role")]
ROLES = ("user", "assistant", "tool")


class SessionFields(_Record):
    """A session as an import reads it; every field may be left out."""

    id: SessionId | None = Field(
        default=None, description="The session's id (the caller's: ids are per user)."
    )
    agent_name: AgentName | None = Field(default=None, description="Default: ?agent_name.")
    title: Title | None = Field(
        default=None, description="Left out: the first user message's start, as a chat turn's."
    )
    status: Literal["active", "cleared"] = "active"
    created_at: ZonedTime | None = Field(default=None, description="Default: the first message's.")
    last_active_at: ZonedTime | None = Field(
        default=None, description="Default: the last message's."
    )
    summary: Text | None = None
    summary_covers_until: ExportedId | None = Field(
        default=None, description="The exported id of the last message the summary covers."
    )
    summary_updated_at: ZonedTime | None = None
    message_count: Ignored = None
    expires_at: Ignored = None


class ImportSession(SessionFields):
    messages: list[Message] = Field(description="In order, oldest first.")


class ImportNotes(_Record):
    agent_name: AgentName
    notes: Text
    version: Ignored = None
    created_at: ZonedTime | None = None
    updated_at: ZonedTime | None = None
    earlier_versions: Ignored = None


MemoryText = Annotated[
    str, PlainValidator(_text_within(1, 4000)), WithJsonSchema(_text_schema(1, 4000))
]


class ImportMemory(_Record):
    """A durable memory of an account's export (GET /export's `memories`)."""

    agent_name: AgentName
    kind: Literal["fact", "assistant", "summary"]
    text: MemoryText
    session_id: SessionId
    created_at: ZonedTime
    expires_at: ZonedTime | None = None
    id: Ignored = None
    message_id: Ignored = None
    score: Ignored = None


class ImportDocument(_Record):
    """An account's export, or the plain shape: sessions, and notes."""

    sessions: list[ImportSession]
    long_term_memory: list[ImportNotes] = Field(
        default_factory=list, description="Imported for agents the caller has no notes for."
    )
    user_id: Ignored = None
    exported_at: Ignored = None
    active_sessions: Ignored = None
    # Those of sessions the document holds are made again from their
    # messages by the backfill; those of sessions gone are imported.
    memories: list[ImportMemory] = Field(
        default_factory=list,
        description="Those of sessions the document does not hold (their transcript gone).",
    )


class SessionDocument(_Record):
    """One session's export."""

    session: SessionFields
    messages: list[Message]


@dataclass(frozen=True)
class Document:
    """A validated import document, either form, as a list of sessions."""

    sessions: list[ImportSession]
    notes: list[ImportNotes]
    single: bool = False  # one session's export: its paths are session.x and messages[j]
    memories: list[ImportMemory] = field(default_factory=list)

    def where_messages(self, index: int) -> str:
        """How errors name the messages of the session at `index`."""
        return "messages" if self.single else f"sessions[{index}].messages"


def read_document(value: object) -> Document:
    """A parsed JSON document as an import: InvalidInput (422) naming each
    malformed record (the first few), e.g. "sessions[3].messages[17].created_at:
    not an ISO 8601 time with a zone"."""
    single = isinstance(value, dict) and "session" in value and "sessions" not in value
    try:
        if single:
            one = SessionDocument.model_validate(value)
            session = ImportSession.model_construct(
                one.session.model_fields_set | {"messages"},
                **dict(one.session),
                messages=one.messages,
            )
            return Document([session], [], single=True)
        document = ImportDocument.model_validate(value)
    except ValidationError as exc:
        raise InvalidInput(describe(exc.errors(include_url=False))) from None
    return Document(document.sessions, document.long_term_memory, memories=document.memories)


def describe(errors: Sequence[ErrorDetails]) -> str:
    """The first few validation errors as one sentence, each naming its place."""
    parts = [f"{_place(e)}: {_message(e)}" for e in errors[:_SHOWN_ERRORS]]
    more = len(errors) - _SHOWN_ERRORS
    return "; ".join(parts) + (f"; and {more} more." if more > 0 else ".")


def _place(error: ErrorDetails) -> str:
    out = ""
    previous: object = None
    loc = list(error.get("loc", ()))
    if error["type"] in ("union_tag_invalid", "union_tag_not_found"):
        loc.append("role")
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not (isinstance(previous, int) and part in ROLES):  # the union's tag
            out += f".{part}" if out else str(part)
        previous = part
    return out or "body"


_MESSAGES = {
    "missing": "is required",
    "extra_forbidden": "is not a field of an import",
    "union_tag_invalid": "must be user, assistant or tool",
    "union_tag_not_found": "is required (user, assistant or tool)",
    "model_type": "must be a JSON object",
    "model_attributes_type": "must be a JSON object",
    "dict_type": "must be a JSON object",
    "list_type": "must be a JSON array",
    "int_type": "must be an integer",
    "bool_type": "must be true or false",
}


def _message(error: ErrorDetails) -> str:
    return _MESSAGES.get(error["type"], error["msg"])


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def parse_json(body: bytes | str) -> object:
    """A request body or file as JSON: ValueError when it is not (NaN and
    Infinity are not JSON, nor nesting past Python's recursion limit)."""
    try:
        return json.loads(body, parse_constant=_no_constant)
    except RecursionError:
        raise ValueError("nested too deeply") from None


class NotJson(ValueError):
    """A body that is not JSON; `not_utf8` when its bytes are not UTF-8."""

    def __init__(self, not_utf8: bool) -> None:
        super().__init__("not UTF-8" if not_utf8 else "not JSON")
        self.not_utf8 = not_utf8


# One body is parsed at a time per process: parsing holds the interpreter for
# stretches (json's C decoder does not let go of it), so several at once
# would take turns with every other request as well as with each other.
_PARSING = threading.Lock()


def _read_body(body: bytes) -> Document:
    with _PARSING:
        try:
            parsed = parse_json(body)
        except UnicodeDecodeError:
            raise NotJson(not_utf8=True) from None
        except ValueError:
            raise NotJson(not_utf8=False) from None
        return read_document(parsed)


async def read_body(body: bytes) -> Document:
    """A request's body as an import (NotJson, or read_document's 422),
    parsed and validated in a worker thread: the event loop goes on
    answering other requests meanwhile."""
    return await asyncio.to_thread(_read_body, body)


# ---------------------------------------------------------------- the import


@dataclass(frozen=True)
class SessionOutcome:
    session_id: uuid.UUID
    imported: bool  # False: skipped, the caller had this session already
    messages: int  # stored by this import


@dataclass(frozen=True)
class ImportResult:
    sessions: list[SessionOutcome]  # in the document's order
    notes_imported: list[str]  # agents
    notes_skipped: list[str]  # agents the caller had notes for
    embeddings_pending: int  # the caller's messages waiting for an embedding
    # The caller's messages whose sessions the backfill gave up on (earlier
    # imports': this one's are queued again): never recalled until re-queued.
    embeddings_failed: int = 0
    memories_imported: int = 0  # durable memories of sessions gone

    @property
    def messages_imported(self) -> int:
        return sum(s.messages for s in self.sessions)


async def import_history(
    db: store.Database,
    settings: Settings,
    caller: store.Caller,
    document: Document,
    limits: store.ImportLimits,
    agent_name: str = "default",
) -> ImportResult:
    """Store the document's sessions and notes for the caller (sessions that
    name no agent: `agent_name`); what the caller has already is skipped.
    `limits`: the database's, as store.start_import read them with the
    request's token.

    413 over IMPORT_MAX_SESSIONS, IMPORT_MAX_MESSAGES_PER_SESSION, a message
    over IMPORT_MAX_MESSAGE_CHARS or the database's size, notes over
    LTM_MAX_CHARS, each naming the record, and `quota_exceeded` when the
    request would take the caller past USER_MAX_STORED_MESSAGES (checked
    with the first transaction: nothing stored).
    """
    _check_counts(document, settings)
    prepared = [
        _prepared(document, i, s, agent_name, settings, limits)
        for i, s in enumerate(document.sessions)
    ]
    notes = [_notes(i, n, settings) for i, n in enumerate(document.notes)]
    ttl = timedelta(hours=settings.session_ttl_hours)
    stored: set[uuid.UUID] = set()
    stored_notes: list[str] = []
    # The notes go with the first transaction (alone when there are no
    # sessions), and so does the quota's check for the whole request.
    sessions = _first_of_each_id(prepared)
    batches = list(_batches(sessions)) or [[]]
    for number, batch in enumerate(batches):
        first = number == 0
        done = await store.import_sessions(
            db, caller, batch, notes if first else (), ttl=ttl, request=sessions if first else None
        )
        stored |= done.session_ids
        stored_notes += done.notes
        if batch:
            # Skipped sessions too: an earlier attempt may have stored them and
            # failed before it queued them.
            await store.queue_embeddings(db, caller, [s.id for s in batch])
    outcomes = []
    for session in prepared:
        fresh = session.id in stored
        stored.discard(session.id)  # a later duplicate of it is skipped
        outcomes.append(SessionOutcome(session.id, fresh, len(session.messages) if fresh else 0))
    remembered = await store.import_memories(
        db,
        caller,
        _durable_memories(document),
        retention_days=settings.memory_retention_days,
    )
    agents = list(dict.fromkeys(n.agent_name for n in notes))
    backlog = await store.embedding_backlog(db, caller)
    return ImportResult(
        sessions=outcomes,
        notes_imported=stored_notes,
        notes_skipped=[a for a in agents if a not in stored_notes],
        embeddings_pending=backlog.pending,
        embeddings_failed=backlog.failed,
        memories_imported=remembered,
    )


def _durable_memories(document: Document) -> list[store.MemoryImport]:
    """The document's memories of sessions it does not hold (the others are
    made again from their messages)."""
    held = {s.id for s in document.sessions if s.id is not None}
    return [
        store.MemoryImport(m.agent_name, m.kind, m.text, m.session_id, m.created_at, m.expires_at)
        for m in document.memories
        if m.session_id not in held
    ]


def _first_of_each_id(sessions: Sequence[store.SessionImport]) -> list[store.SessionImport]:
    """The sessions, a later one with an id seen before left out (skipped, as
    one the caller had before)."""
    seen: set[uuid.UUID] = set()
    first = []
    for session in sessions:
        if session.id not in seen:
            seen.add(session.id)
            first.append(session)
    return first


def _check_counts(document: Document, settings: Settings) -> None:
    limit = settings.import_max_sessions
    if len(document.sessions) > limit:
        raise PayloadTooLarge(
            f"sessions: {len(document.sessions)} in one request; the limit is {limit}"
            " (IMPORT_MAX_SESSIONS): send them in several requests (memchat import does)."
        )
    limit = settings.import_max_messages_per_session
    for index, session in enumerate(document.sessions):
        if len(session.messages) > limit:
            raise PayloadTooLarge(
                f"{document.where_messages(index)}: {len(session.messages)} messages; a session"
                f" may have at most {limit} (IMPORT_MAX_MESSAGES_PER_SESSION)."
            )


def _batches(sessions: Sequence[store.SessionImport]) -> Iterator[list[store.SessionImport]]:
    """Whole sessions, about TRANSACTION_MESSAGES messages a batch."""
    return packed(sessions, lambda session: max(1, len(session.messages)), TRANSACTION_MESSAGES)


def _prepared(
    document: Document,
    index: int,
    given: ImportSession,
    agent_name: str,
    settings: Settings,
    limits: store.ImportLimits,
) -> store.SessionImport:
    """A session as the store takes it: its messages in LangChain's shape,
    its title, times and summary settled, and its id."""
    where = document.where_messages(index)
    stored = list(_stored_messages(where, given.messages, settings, limits))
    times = [m.created_at for m in stored]
    now = datetime.now(UTC)
    created = given.created_at or (min(times) if times else now)
    title = given.title if "title" in given.model_fields_set else _title(given.messages)
    session = store.SessionImport(
        id=given.id or CONTENT_IDS,  # until its content is known
        agent_name=given.agent_name or agent_name,
        title=title,
        status=given.status,
        created_at=created,
        last_active_at=given.last_active_at or (max(times) if times else created),
        messages=stored,
        summary=_summary(given),
    )
    if given.id is not None:
        return session
    return dataclasses.replace(session, id=_content_id(given, session))


def _stored_messages(
    where: str, given: Sequence[Message], settings: Settings, limits: store.ImportLimits
) -> Iterator[store.MessageImport]:
    keys: set[str] = set()
    max_chars = min(settings.import_max_message_chars, limits.max_message_chars)
    for number, item in enumerate(given):
        client_message_id = None
        feedback = None
        if len(item.content) > max_chars:
            raise PayloadTooLarge(
                f"{where}[{number}].content: {len(item.content)} characters; an imported"
                f" message may have at most {max_chars} (IMPORT_MAX_MESSAGE_CHARS)."
            )
        if isinstance(item, UserMessage):
            message = messages.human(item.content)
            key = item.metadata.client_message_id if item.metadata else None
            if key is not None and key not in keys:  # a key names one message of a session
                keys.add(key)
                client_message_id = key
        elif isinstance(item, AssistantMessage):
            message = _answer(item)
            if item.feedback is not None:
                f = item.feedback
                feedback = store.FeedbackImport(f.rating, f.comment, f.created_at, f.updated_at)
        else:
            message = messages.tool(
                item.content, tool_call_id=item.metadata.tool_call_id, name=item.metadata.name or ""
            )
            message["data"]["name"] = item.metadata.name
        size = len(json.dumps(message, ensure_ascii=False).encode())
        if size > limits.max_message_bytes:
            raise PayloadTooLarge(
                f"{where}[{number}]: {size} bytes as stored; a message may have at most"
                f" {limits.max_message_bytes}."
            )
        yield store.MessageImport(message, item.created_at, client_message_id, feedback)


def _answer(item: AssistantMessage) -> dict[str, Any]:
    """An assistant message as a chat turn stores it, with the usage and
    model the export showed."""
    meta = item.metadata or AssistantMetadata()
    calls = [{"id": c.id, "name": c.name, "args": c.args} for c in meta.tool_calls or []]
    message = messages.ai(item.content, tool_calls=calls, model=meta.model)
    if meta.usage is not None:
        usage = meta.usage.model_dump(exclude_none=True)
        message["data"]["usage_metadata"] = usage
        message["data"]["response_metadata"]["token_usage"] = {
            "prompt_tokens": usage["input_tokens"],
            "completion_tokens": usage["output_tokens"],
            "total_tokens": usage["total_tokens"],
        }
    return message


def _title(given: Sequence[Message]) -> str | None:
    first = next((m.content for m in given if isinstance(m, UserMessage)), None)
    if first is None:
        return None
    line = " ".join(first.split())
    return line if len(line) <= _TITLE_CHARS else line[: _TITLE_CHARS - 1] + "…"


def _summary(given: ImportSession) -> store.SummaryImport | None:
    """The session's rolling summary, if the message it ends with is in the
    file (else the worker makes a new one when the session goes on)."""
    if given.summary is None or given.summary_covers_until is None:
        return None
    for ordinal, item in enumerate(given.messages, start=1):
        if item.id == given.summary_covers_until:
            return store.SummaryImport(given.summary, ordinal, given.summary_updated_at)
    return None


def _content_id(given: ImportSession, session: store.SessionImport) -> uuid.UUID:
    """The id of a session the file names none for: the same content, the same id."""
    digest = hashlib.sha256()
    times = (given.created_at, given.last_active_at, given.summary_updated_at)
    head: list[Any] = [session.agent_name, session.title, session.status, given.summary]
    head += [given.summary_covers_until, *(_instant(t) for t in times)]
    digest.update(_canonical(head))
    for message in session.messages:
        feedback = message.feedback.__dict__ if message.feedback else None
        digest.update(
            _canonical(
                [message.message, _instant(message.created_at), message.client_message_id, feedback]
            )
        )
    return uuid.uuid5(CONTENT_IDS, digest.hexdigest())


def _instant(value: datetime | None) -> int | None:
    """A time as microseconds since the epoch: one value per instant, whatever its zone."""
    if value is None:
        return None
    return (value - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, default=_instant).encode()


def _notes(index: int, given: ImportNotes, settings: Settings) -> store.NotesImport:
    limit = settings.ltm_max_chars
    if len(given.notes) > limit:
        raise PayloadTooLarge(
            f"long_term_memory[{index}].notes: {len(given.notes)} characters; the limit is {limit}."
        )
    return store.NotesImport(given.agent_name, given.notes, given.created_at, given.updated_at)
