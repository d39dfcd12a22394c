"""Errors the API turns into the contract's error JSON.

Raised by use cases and the store; the HTTP edge maps each to its status
and code. The detail is a sentence a person can act on.
"""

from __future__ import annotations


class MemchatError(Exception):
    status = 500
    code = "internal_error"
    detail = "Something went wrong on our side; please retry."

    def __init__(self, detail: str | None = None) -> None:
        super().__init__(detail or self.detail)
        if detail:
            self.detail = detail


class BadRequest(MemchatError):
    status, code = 400, "bad_request"
    detail = "The request is malformed."


class Unauthorized(MemchatError):
    status, code = 401, "unauthorized"
    detail = "Send a valid Supabase access token as 'Authorization: Bearer <token>'."


class NotFound(MemchatError):
    status, code = 404, "not_found"
    detail = "Not found."


class SessionNotFound(NotFound):
    code = "session_not_found"
    detail = "No such session for this user."


class Conflict(MemchatError):
    status, code = 409, "conflict"
    detail = "The resource changed meanwhile; read it again and retry."


class PayloadTooLarge(MemchatError):
    status, code = 413, "payload_too_large"
    detail = "The request is too large."


class UpstreamError(MemchatError):
    status, code = 502, "model_upstream_error"
    detail = "The model provider failed to answer; nothing was stored. Please retry."


class DatabaseUnavailable(MemchatError):
    status, code = 503, "database_unavailable"
    detail = "The database is unreachable right now; please retry shortly."


class UpstreamTimeout(MemchatError):
    status, code = 504, "model_timeout"
    detail = "The model took too long to answer; nothing was stored. Please retry."
