"""SessionsFunction: POST /chat/clear-session and the small routes
(GET /sessions, GET /sessions/active, GET/PUT/DELETE /memory, DELETE /me,
GET /health); ROUTE_GROUPS=sessions, no model key."""

from memchat.handlers.http import handler

__all__ = ["handler"]
