"""Development access tokens, shaped like Supabase Auth's.

Signed HS256 with the local JWT secret; used by `memchat token` and tests.
Never used by the deployed service.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import jwt


def mint(
    secret: str,
    user_id: uuid.UUID,
    *,
    email: str | None = None,
    ttl_seconds: int = 3600,
    issuer: str | None = None,
    **extra: Any,
) -> str:
    now = int(time.time())
    claims: dict[str, Any] = {
        "sub": str(user_id),
        "aud": "authenticated",
        "role": "authenticated",
        "email": email or "",
        "iat": now,
        "exp": now + ttl_seconds,
        "aal": "aal1",
        "session_id": str(uuid.uuid4()),
        "is_anonymous": False,
    }
    if issuer:
        claims["iss"] = issuer
    claims.update(extra)
    return jwt.encode(claims, secret, algorithm="HS256")
