"""Per-user throttles: which requests take a token from which bucket, at what rate.

Every write and every expensive read of a user is throttled, each kind in
its own token bucket kept in Postgres (memchat.rate_buckets: refilled
continuously at `per_minute`, holding at most `burst`), checked in the
request's own transaction so a refused request does nothing at all. The
rates are settings (`<BUCKET>_RATE_PER_MINUTE`, `<BUCKET>_RATE_BURST`; a rate
of 0 turns a bucket off); this module is the one place that says which
bucket a request uses:

- chat: POST /chat
- write: PUT and DELETE /memory, POST /memory/restore, POST /chat/clear-session,
  POST and DELETE /chat/feedback
- read: GET /chat/export/{session_id}, GET /chat/stats, GET /chat/stats/{session_id},
  GET /memory/search
- export: GET /export (everything the user has)
- erase: DELETE /me
- import: POST /sessions/import (a history import, however many sessions it holds)

A bucket outlives the user's data (DELETE /me keeps it), so deleting the
account's data cannot reset a throttle; it goes with the user (auth.users).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from memchat.config import Settings


class Bucket(StrEnum):
    CHAT = "chat"
    WRITE = "write"
    READ = "read"
    EXPORT = "export"
    ERASE = "erase"
    IMPORT = "import"


@dataclass(frozen=True)
class Rate:
    """One bucket's rate: `per_minute` tokens a minute, at most `burst` at once."""

    per_minute: float  # 0: not throttled
    burst: int

    @property
    def on(self) -> bool:
        return self.per_minute > 0


OFF = Rate(0, 1)

# What a 429 says the caller sent too many of.
_WHAT = {
    Bucket.CHAT: "chat messages",
    Bucket.WRITE: "changes",
    Bucket.READ: "session exports, stats requests and memory searches",
    Bucket.EXPORT: "exports of all your data",
    Bucket.ERASE: "requests to delete your data",
    Bucket.IMPORT: "history imports",
}


def describe(refusal: str) -> str:
    """What a throttled request was one too many of, from the database's
    refusal ("rate limited (write)", memchat.throttle)."""
    for bucket, what in _WHAT.items():
        if refusal.endswith(f"({bucket.value})"):
            return what
    return "requests"


def rates(settings: Settings) -> dict[Bucket, Rate]:
    """Each bucket's rate, from its two settings."""
    return {
        bucket: Rate(
            float(getattr(settings, f"{bucket.value}_rate_per_minute")),
            int(getattr(settings, f"{bucket.value}_rate_burst")),
        )
        for bucket in Bucket
    }
