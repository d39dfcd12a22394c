"""Keyset cursors: a page's last position as an opaque string, and back."""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from memchat.errors import BadRequest

BAD_CURSOR = "cursor is not valid; pass next_cursor from the previous page as it is."


def pack(position: list[Any]) -> str:
    raw = json.dumps(position).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def unpack(cursor: str) -> Any:
    """The position a cursor holds (BadRequest when it holds none)."""
    try:
        return json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except (binascii.Error, ValueError):
        raise BadRequest(BAD_CURSOR) from None
