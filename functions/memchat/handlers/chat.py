"""ChatFunction: POST /chat (ROUTE_GROUPS=chat; the only function with the model key)."""

from memchat.handlers.http import handler

__all__ = ["handler"]
