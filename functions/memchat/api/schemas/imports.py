"""POST /sessions/import and GET /sessions/import/status: the answers, and the
request body as the OpenAPI document describes it (the route reads the body
itself, so each malformed record gets the contract's 422 naming it)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, Field, TypeAdapter

from memchat.usecases.history_import import ImportDocument, SessionDocument

if TYPE_CHECKING:
    from memchat.config import Settings
    from memchat.usecases.history_import import ImportResult


def _inlined(schema: Any, definitions: dict[str, Any]) -> Any:
    """`schema` with its local references replaced by what they name (the
    import's models do not refer to themselves), so it can stand in an
    operation of the OpenAPI document without entries in its components."""
    if isinstance(schema, dict):
        ref = schema.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            return _inlined(definitions[ref.removeprefix("#/$defs/")], definitions)
        return {k: _inlined(v, definitions) for k, v in schema.items() if k != "$defs"}
    if isinstance(schema, list):
        return [_inlined(item, definitions) for item in schema]
    return schema


def _request_body() -> dict[str, Any]:
    schema = TypeAdapter(ImportDocument | SessionDocument).json_schema()
    return {
        "required": True,
        "description": (
            "An account's export (GET /export JSON), one session's (GET"
            " /chat/export/{session_id} JSON), or the plain shape"
            ' `{"sessions": [{"id"?, "agent_name"?, "title"?, "messages": [{"role",'
            ' "content", "created_at"}]}]}`. At most IMPORT_MAX_BYTES.'
        ),
        "content": {"application/json": {"schema": _inlined(schema, schema.get("$defs", {}))}},
    }


REQUEST_BODY = _request_body()


class ImportedSessionOut(BaseModel):
    session_id: str = Field(json_schema_extra={"format": "uuid"})
    status: Literal["imported", "skipped"] = Field(
        description="skipped: the caller had this session already (an earlier import)."
    )
    messages: int = Field(description="Messages this request stored in it.")


class ImportOut(BaseModel):
    imported_sessions: int
    skipped_sessions: int
    imported_messages: int
    sessions: list[ImportedSessionOut] = Field(description="In the request's order.")
    imported_notes: list[str] = Field(description="Agents whose notes were imported.")
    skipped_notes: list[str] = Field(description="Agents the caller had notes for already.")
    embeddings_pending: int = Field(
        description="The caller's messages waiting for an embedding (recall finds them after)."
    )
    embeddings_failed: int = Field(
        description="The caller's messages in sessions whose embeddings the backfill gave up"
        " on: recall cannot find them until the session is imported (queued) again."
    )
    imported_memories: int = Field(
        default=0,
        description="Durable memories of sessions the document does not hold (an account"
        " export's, their transcript gone), stored; the backfill embeds them.",
    )

    @classmethod
    def of(cls, result: ImportResult) -> ImportOut:
        imported = sum(1 for s in result.sessions if s.imported)
        return cls(
            imported_sessions=imported,
            skipped_sessions=len(result.sessions) - imported,
            imported_messages=result.messages_imported,
            sessions=[
                ImportedSessionOut(
                    session_id=str(s.session_id),
                    status="imported" if s.imported else "skipped",
                    messages=s.messages,
                )
                for s in result.sessions
            ],
            imported_notes=result.notes_imported,
            skipped_notes=result.notes_skipped,
            embeddings_pending=result.embeddings_pending,
            embeddings_failed=result.embeddings_failed,
            imported_memories=result.memories_imported,
        )


class ImportLimitsOut(BaseModel):
    max_request_bytes: int = Field(description="IMPORT_MAX_BYTES: one request's body.")
    max_sessions_per_request: int = Field(description="IMPORT_MAX_SESSIONS.")
    max_messages_per_session: int = Field(description="IMPORT_MAX_MESSAGES_PER_SESSION.")
    max_message_chars: int = Field(
        description="IMPORT_MAX_MESSAGE_CHARS: any one imported message's text."
    )

    @classmethod
    def of(cls, settings: Settings) -> ImportLimitsOut:
        return cls(
            max_request_bytes=settings.import_max_bytes,
            max_sessions_per_request=settings.import_max_sessions,
            max_messages_per_session=settings.import_max_messages_per_session,
            max_message_chars=settings.import_max_message_chars,
        )


class ImportStatusOut(BaseModel):
    embeddings_pending: int = Field(
        description="The caller's messages waiting for an embedding (the backfill embeds them)."
    )
    embeddings_failed: int = Field(
        description="The caller's messages in sessions whose embeddings the backfill gave up"
        " on (the provider failed again and again): never embedded until the session is"
        " imported (queued) again."
    )
    recall_ready: bool = Field(
        description="embeddings_pending and embeddings_failed are both 0: recall sees every"
        " imported message."
    )
    limits: ImportLimitsOut = Field(description="What one POST /sessions/import may hold.")
