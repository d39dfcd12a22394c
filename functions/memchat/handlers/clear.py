"""SessionsFunction: POST /chat/clear-session and the small routes
(GET /sessions, GET /sessions/active, GET/PUT/DELETE /memory, DELETE /me,
GET /health)."""

from memchat.handlers.http import handler

__all__ = ["handler"]
