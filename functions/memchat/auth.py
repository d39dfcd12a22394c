"""Supabase access-token verification.

HS256 tokens are checked with the project's JWT secret; ES256/RS256 tokens
with the project's JWKS (`$SUPABASE_URL/auth/v1/.well-known/jwks.json`),
cached across invocations and refetched when a token names an unknown `kid`.
The accepted algorithm comes from our configuration or the key's type,
never from the token's own header.

A token that fails is a 401 whose detail says what to do about it (never
PyJWT's own message); a key set that cannot be fetched is a 503
(`auth_unavailable`), not a 401, which would sign the user out.

PyJWT is imported on first use, not with this module: it brings in
`cryptography` (a sizeable part of a cold start), which a process that has not
verified a token yet does not need. Under Lambda SnapStart the import is
made before the snapshot (memchat.handlers.snapstart), and `reset()` drops
the cached key set after a restore.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from memchat.errors import AuthUnavailable, Unauthorized

if TYPE_CHECKING:
    import jwt

    from memchat.config import Settings

_REQUIRED_CLAIMS = ["exp", "sub", "aud", "role"]
LEEWAY_SECONDS = 10

_NOT_THIS_PROJECT = "The access token was not signed by this project; sign in again."
_NOT_A_USER = "The access token's subject is not a user id; send a signed-in user's token."
_WRONG_ALGORITHM = "The access token's signing algorithm is not accepted here; sign in again."
_INVALID = "The access token is not valid; sign in again."


@functools.cache
def _refusals() -> tuple[tuple[type[Exception], str], ...]:
    """Why a token is refused, in words a person can act on, most specific first."""
    import jwt

    return (
        (jwt.ExpiredSignatureError, "The access token has expired; sign in again."),
        (
            jwt.ImmatureSignatureError,
            "The access token is not valid yet; check the device's clock and sign in again.",
        ),
        (jwt.InvalidSignatureError, _NOT_THIS_PROJECT),
        (jwt.PyJWKClientError, _NOT_THIS_PROJECT),  # no key with the token's kid
        (jwt.InvalidAlgorithmError, _WRONG_ALGORITHM),
        (
            jwt.InvalidAudienceError,
            "The access token is not meant for this API (its audience must be 'authenticated');"
            " send the signed-in user's access token.",
        ),
        (
            jwt.InvalidIssuerError,
            "The access token was issued by another Supabase project; sign in to this one.",
        ),
        (jwt.exceptions.InvalidSubjectError, _NOT_A_USER),
        (
            jwt.DecodeError,
            "The access token is malformed; send it exactly as Supabase issued it.",
        ),
    )


class _KeySetUnavailable(Exception):
    """The project's key set could not be fetched, or what came is not a key set."""


@functools.cache
def _project_keys() -> type[jwt.PyJWKClient]:
    """The PyJWKClient subclass the verifier uses (defined once PyJWT is imported)."""
    import jwt

    class ProjectKeys(jwt.PyJWKClient):
        """A PyJWKClient that tells a key set it could not get (an outage: 503)
        apart from a set without the token's key (the token's fault: 401); PyJWT
        raises PyJWKClientError for both."""

        def get_signing_keys(self, refresh: bool = False) -> list[jwt.PyJWK]:
            try:
                return super().get_signing_keys(refresh)
            except (jwt.PyJWKClientError, jwt.PyJWKSetError, ValueError, OSError) as exc:
                # ValueError: a body that is not JSON; OSError: a connection
                # dropped while the body was read (PyJWT does not wrap either).
                raise _KeySetUnavailable from exc

    return ProjectKeys


def _refusal(exc: jwt.PyJWTError) -> str:
    import jwt

    if isinstance(exc, jwt.MissingRequiredClaimError):
        # exc.claim is one of our required names, not text from the token.
        return f"The access token has no '{exc.claim}' claim; send a Supabase access token."
    return next((detail for kind, detail in _refusals() if isinstance(exc, kind)), _INVALID)


@dataclass(frozen=True)
class Caller:
    """A verified user: the id and the claims the database sees."""

    user_id: uuid.UUID
    claims: Mapping[str, Any]


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
        jwks_timeout: float = 5.0,
    ) -> None:
        self._secret = settings.supabase_jwt_secret
        self._issuer = settings.jwt_issuer
        self._jwks_url = settings.jwks_url
        self._allow_anonymous = settings.allow_anonymous_users
        self._jwks_lifespan = jwks_lifespan
        self._jwks_refetch_cooldown = jwks_refetch_cooldown
        self._jwks_timeout = jwks_timeout
        self._jwks: jwt.PyJWKClient | None = None

    def reset(self) -> None:
        """Forget the cached key set and its client (after a SnapStart restore).

        The cache's lifespan and refetch cooldown are measured from times taken
        before the snapshot, and every instance restored from it would share
        them: the next token with a kid fetches the key set afresh. HS256
        verification keeps nothing to reset.
        """
        self._jwks = None

    def _jwks_client(self) -> jwt.PyJWKClient:
        if self._jwks is None:
            assert self._jwks_url is not None
            # Only the whole set is cached: a per-kid cache (cache_keys) would
            # keep trusting a revoked key for the life of a warm instance.
            self._jwks = _project_keys()(
                self._jwks_url,
                cache_keys=False,
                cache_jwk_set=True,
                lifespan=self._jwks_lifespan,
                cooldown_duration=self._jwks_refetch_cooldown,
                timeout=self._jwks_timeout,
            )
        return self._jwks

    def _key_and_algorithms(self, token: str) -> tuple[Any, list[str]]:
        import jwt

        header = jwt.get_unverified_header(token)
        if self._by_secret(header):
            return self._secret, ["HS256"]
        if self._jwks_url is None:
            raise Unauthorized(_WRONG_ALGORITHM)
        try:
            signing_key = self._jwks_client().get_signing_key_from_jwt(token)
        except _KeySetUnavailable as exc:
            raise AuthUnavailable() from exc
        algorithm = {"EC": "ES256", "RSA": "RS256"}.get(signing_key.key_type or "")
        if algorithm is None:
            raise Unauthorized(_WRONG_ALGORITHM)  # only ES256 and RS256 keys
        return signing_key.key, [algorithm]

    def _by_secret(self, header: dict[str, Any]) -> bool:
        """Whether a token with this header is verified with the JWT secret."""
        return header.get("alg") == "HS256" and bool(self._secret)

    def needs_key_fetch(self, token: str) -> bool:
        """Whether verifying `token` may fetch the project's key set (a
        request to Supabase, up to `jwks_timeout` seconds): not for an HS256
        token with the secret, a token verify refuses from its header alone,
        or a kid in a cached set that is still fresh. The API verifies such
        tokens on the event loop and the others in a thread."""
        import jwt

        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            return False
        if self._by_secret(header) or self._jwks_url is None:
            return False  # the secret verifies it, or verify refuses it
        cache = self._jwks.jwk_set_cache if self._jwks is not None else None
        cached = cache.get() if cache is not None else None  # None once expired
        kid = header.get("kid")
        return cached is None or not any(key.key_id == kid for key in cached.keys)

    def verify(self, token: str) -> Caller:
        """The caller behind a Supabase access token; raises Unauthorized, or
        AuthUnavailable when the project's signing keys cannot be fetched."""
        import jwt

        try:
            key, algorithms = self._key_and_algorithms(token)
            claims: dict[str, Any] = jwt.decode(
                token,
                key,
                algorithms=algorithms,
                audience="authenticated",
                issuer=self._issuer,
                leeway=LEEWAY_SECONDS,
                options={"require": _REQUIRED_CLAIMS + (["iss"] if self._issuer else [])},
            )
        except jwt.PyJWTError as exc:
            raise Unauthorized(_refusal(exc)) from exc
        if claims.get("role") != "authenticated":
            raise Unauthorized(
                "The access token's role must be 'authenticated': send a signed-in user's"
                " token, not the project's anon or service key."
            )
        if claims.get("is_anonymous", False) is not False and not self._allow_anonymous:
            raise Unauthorized(
                "Anonymous (guest) sign-ins cannot use this service; sign in with an account."
            )
        try:
            user_id = uuid.UUID(str(claims["sub"]))
        except ValueError as exc:
            raise Unauthorized(_NOT_A_USER) from exc
        return Caller(user_id=user_id, claims=claims)
