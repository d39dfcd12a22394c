"""Errors the API turns into the contract's error JSON.

Raised by use cases and the store; the HTTP edge maps each to its status
and code. The detail is a sentence a person can act on.
"""

from __future__ import annotations

import math


class MemchatError(Exception):
    status = 500
    code = "internal_error"
    detail = "Something went wrong on our side; please retry."

    def __init__(self, detail: str | None = None) -> None:
        super().__init__(detail or self.detail)
        if detail:
            self.detail = detail

    @property
    def headers(self) -> dict[str, str]:
        """Extra response headers (Retry-After, WWW-Authenticate)."""
        return {}


class BadRequest(MemchatError):
    status, code = 400, "bad_request"
    detail = "The request is malformed."


class Unauthorized(MemchatError):
    status, code = 401, "unauthorized"
    detail = "Send a valid Supabase access token as 'Authorization: Bearer <token>'."

    @property
    def headers(self) -> dict[str, str]:
        return {"WWW-Authenticate": "Bearer"}


class NotFound(MemchatError):
    status, code = 404, "not_found"
    detail = "Not found."


class SessionNotFound(NotFound):
    code = "session_not_found"
    detail = "No such session for this user."


class MemoryNotFound(NotFound):
    code = "memory_not_found"
    detail = "No such memory for this user."


class MessageNotFound(NotFound):
    code = "message_not_found"
    detail = "No such answer for this user."


class Conflict(MemchatError):
    status, code = 409, "conflict"
    detail = "The resource changed meanwhile; read it again and retry."


class NotesConflict(Conflict):
    code = "notes_conflict"
    detail = "The long-term notes changed meanwhile; read them again and retry."


class DuplicateClientMessage(Conflict):
    """A concurrent request with the same client_message_id won the race
    (internal: the turn answers with the stored answer instead)."""


class IdempotencyConflict(Conflict):
    code = "idempotency_conflict"
    detail = (
        "This client_message_id was already used with a different message;"
        " use a new id for a new message."
    )


class IdempotencyInFlight(Conflict):
    """The same client_message_id is being answered by another request."""

    code = "idempotency_in_flight"
    detail = (
        "A request with this client_message_id is still being answered;"
        " retry shortly to get its answer."
    )

    @property
    def headers(self) -> dict[str, str]:
        return {"Retry-After": "1"}


class PayloadTooLarge(MemchatError):
    status, code = 413, "payload_too_large"
    detail = "The request is too large."


class QuotaExceeded(PayloadTooLarge):
    """A write that would take the user past USER_MAX_STORED_MESSAGES; nothing is stored."""

    code = "quota_exceeded"

    def __init__(self, limit: int, stored: int | None = None, adding: int | None = None) -> None:
        self.limit = limit
        held = f"you have {stored} stored; " if stored is not None else ""
        more = f" {adding} more" if adding is not None else " more"
        super().__init__(
            f"Storing{more} messages would pass your limit of {limit} stored messages"
            f" (USER_MAX_STORED_MESSAGES); {held}nothing was stored. Clear sessions you no"
            " longer need (POST /chat/clear-session) or wait until old ones expire."
        )


class InvalidInput(MemchatError):
    """A value the database refused (a limit or a format rule)."""

    status, code = 422, "validation_error"
    detail = "A value in the request is not allowed."


class RateLimited(MemchatError):
    status, code = 429, "rate_limited"
    detail = "Too many chat messages; please wait a moment."

    def __init__(self, retry_after: float, what: str = "chat messages") -> None:
        self.retry_after = max(1, math.ceil(retry_after))
        # Set when the request's body is left unread (a refused import): the
        # connection is closed rather than the rest read only to be dropped.
        self.body_unread = False
        super().__init__(f"Too many {what}; retry in {self.retry_after} s.")

    @property
    def headers(self) -> dict[str, str]:
        close = {"Connection": "close"} if self.body_unread else {}
        return {"Retry-After": str(self.retry_after), **close}


class UnknownToolCall(BadRequest):
    """A continuation of a tool call memchat did not make (or already answered)."""

    code = "unknown_tool_call"


class UpstreamError(MemchatError):
    status, code = 502, "model_upstream_error"
    detail = "The model provider failed to answer; nothing was stored. Please retry."


class DatabasePermissionDenied(MemchatError):
    """The database refused one of the API's own statements (a missing grant or
    policy after a bad migration): our fault, logged with what was refused."""

    status, code = 500, "internal_error"

    @classmethod
    def of(cls, exc: Exception) -> DatabasePermissionDenied:
        import logging

        diag = getattr(exc, "diag", None)
        # PostgreSQL's own sentence ("permission denied for table x", "new row
        # violates row-level security policy for table x") names objects,
        # never values.
        logging.getLogger("memchat.store.db").error(
            "database permission denied: check the migrations' grants and policies",
            extra={
                "sqlstate": getattr(exc, "sqlstate", None),
                "db_error": getattr(diag, "message_primary", None),
                "db_table": getattr(diag, "table_name", None),
            },
        )
        return cls()


class DatabaseUnavailable(MemchatError):
    status, code = 503, "database_unavailable"
    detail = "The database is unreachable right now; please retry shortly."


class AuthUnavailable(MemchatError):
    """The signing keys could not be fetched: not the user's fault, so not a 401
    (a 401 makes web apps sign the user out during an auth outage)."""

    status, code = 503, "auth_unavailable"
    detail = "The sign-in keys could not be fetched right now; please retry shortly."

    @property
    def headers(self) -> dict[str, str]:
        return {"Retry-After": "5"}


class UpstreamTimeout(MemchatError):
    status, code = 504, "model_timeout"
    detail = "The model took too long to answer; nothing was stored. Please retry."


class RecallUnavailable(MemchatError):
    status, code = 503, "recall_unavailable"
    detail = "Memory search is unavailable right now (the embeddings provider); please retry."


class RecallOff(MemchatError):
    status, code = 409, "recall_disabled"
    detail = "Memory is off on this deployment (MEMORY_ENABLED=0)."


class NaiveTime(BadRequest):
    code = "invalid_as_of"
    detail = "as_of needs a time zone, e.g. 2023-05-30T23:40:00Z."
