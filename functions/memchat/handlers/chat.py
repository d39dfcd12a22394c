"""ChatFunction: POST /chat."""

from memchat.handlers.http import handler

__all__ = ["handler"]
