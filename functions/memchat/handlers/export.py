"""ExportFunction: GET /chat/export/{session_id} and GET /export."""

from memchat.handlers.http import handler

__all__ = ["handler"]
