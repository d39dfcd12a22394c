"""Supabase access-token verification.

HS256 tokens are checked with the project's JWT secret; ES256/RS256 tokens
with the project's JWKS (`$SUPABASE_URL/auth/v1/.well-known/jwks.json`),
cached across invocations and refetched when a token names an unknown `kid`.
The accepted algorithm comes from our configuration or the key's type,
never from the token's own header.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

import jwt

from memchat.errors import Unauthorized
from memchat.store import Caller

if TYPE_CHECKING:
    from memchat.config import Settings

_REQUIRED_CLAIMS = ["exp", "sub", "aud", "role"]
_LEEWAY_SECONDS = 10


class TokenVerifier:
    """Verifies access tokens; one per process, so the key set stays cached.

    The project's key set is cached for `jwks_lifespan` seconds (a key removed
    from it, e.g. revoked, stops being accepted within that time). A token
    naming a kid that is not in the cached set refetches it, at most once per
    `jwks_refetch_cooldown` seconds, so tokens with made-up kids cannot make
    every request fetch the keys.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        jwks_lifespan: float = 600.0,
        jwks_refetch_cooldown: float = 30.0,
    ) -> None:
        self._secret = settings.supabase_jwt_secret
        self._issuer = settings.jwt_issuer
        self._jwks_url = settings.jwks_url
        self._jwks_lifespan = jwks_lifespan
        self._jwks_refetch_cooldown = jwks_refetch_cooldown
        self._jwks: jwt.PyJWKClient | None = None

    def _jwks_client(self) -> jwt.PyJWKClient:
        if self._jwks is None:
            assert self._jwks_url is not None
            # Only the whole set is cached: a per-kid cache (cache_keys) would
            # keep trusting a revoked key for the life of a warm instance.
            self._jwks = jwt.PyJWKClient(
                self._jwks_url,
                cache_keys=False,
                cache_jwk_set=True,
                lifespan=self._jwks_lifespan,
                cooldown_duration=self._jwks_refetch_cooldown,
                timeout=5,
            )
        return self._jwks

    def _key_and_algorithms(self, token: str) -> tuple[Any, list[str]]:
        header = jwt.get_unverified_header(token)
        if header.get("alg") == "HS256" and self._secret:
            return self._secret, ["HS256"]
        if self._jwks_url is None:
            raise Unauthorized("This token's signing algorithm is not accepted here.")
        try:
            signing_key = self._jwks_client().get_signing_key_from_jwt(token)
        except jwt.PyJWKClientConnectionError as exc:
            raise Unauthorized("The signing keys could not be fetched; retry shortly.") from exc
        algorithm = {"EC": "ES256", "RSA": "RS256"}.get(signing_key.key_type or "")
        if algorithm is None:
            raise Unauthorized("This token's signing key is not an ES256 or RS256 key.")
        return signing_key.key, [algorithm]

    def verify(self, token: str) -> Caller:
        """The caller behind a Supabase access token; raises Unauthorized."""
        try:
            key, algorithms = self._key_and_algorithms(token)
            claims: dict[str, Any] = jwt.decode(
                token,
                key,
                algorithms=algorithms,
                audience="authenticated",
                issuer=self._issuer,
                leeway=_LEEWAY_SECONDS,
                options={"require": _REQUIRED_CLAIMS + (["iss"] if self._issuer else [])},
            )
        except jwt.ExpiredSignatureError as exc:
            raise Unauthorized("The access token has expired; sign in again.") from exc
        except jwt.PyJWKClientError as exc:
            raise Unauthorized("The token was not signed by a key of this project.") from exc
        except jwt.InvalidTokenError as exc:
            raise Unauthorized(f"Invalid access token: {exc}.") from exc
        if claims.get("role") != "authenticated":
            raise Unauthorized("The token's role must be 'authenticated'.")
        try:
            user_id = uuid.UUID(str(claims["sub"]))
        except ValueError as exc:
            raise Unauthorized("The token's subject is not a user id.") from exc
        return Caller(user_id=user_id, claims=claims)
