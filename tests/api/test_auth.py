"""Access tokens on POST /chat: HS256 with the project secret, ES256/RS256
through the project's JWKS (served here by a local HTTP server), every way a
token must be refused (401 with the error JSON, a detail in our words, model
never called), and signing keys that cannot be fetched (503, not 401).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import jwt
import psycopg
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from jwt.algorithms import ECAlgorithm, RSAAlgorithm

from memchat import bootstrap, devtokens
from memchat.api.main import create_app
from memchat.auth import TokenVerifier
from tests.conftest import JWT_SECRET, UNUSED_DATABASE, make_settings
from tests.utils.api import ApiClient
from tests.utils.chat_api import assert_error, chat
from tests.utils.fake_openai import FakeOpenAI
from tests.utils.users import UserFactory

JWKS_PATH = "/auth/v1/.well-known/jwks.json"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def hand_made_token(header: dict[str, Any], claims: dict[str, Any], key: bytes | None) -> str:
    """A JWT signed with HMAC-SHA256 over `key` (None: no signature), by hand:
    PyJWT refuses to make the malicious ones."""
    signing_input = f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(claims).encode())}"
    signature = b""
    if key is not None:
        signature = hmac.new(key, signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{_b64(signature)}"


def claims_for(user_id: uuid.UUID, **extra: Any) -> dict[str, Any]:
    now = int(time.time())
    return {
        "sub": str(user_id),
        "aud": "authenticated",
        "role": "authenticated",
        "iat": now,
        "exp": now + 3600,
        **extra,
    }


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def refused(client: ApiClient, headers: dict[str, str], model: FakeOpenAI) -> dict[str, Any]:
    calls = model.calls
    r = await client.post("/chat", json={"message": "hi"}, headers=headers)
    body = assert_error(r, 401, "unauthorized")
    assert r.headers["www-authenticate"] == "Bearer"
    assert model.calls == calls
    return body


# --------------------------------------------------------- HS256 (secret)


async def test_a_valid_hs256_token_is_accepted(api: ApiClient, model: FakeOpenAI) -> None:
    _, auth = api.new_user()
    assert (await chat(api, auth, "hi"))["answer"] == "echo: hi"


@pytest.mark.parametrize(
    "authorization",
    ["", "Bearer", "Bearer ", "Bearer garbage", "Bearer a.b.c", "Token abc", "Basic dXNlcjpwdw=="],
    ids=["empty", "no-token", "blank-token", "garbage", "three-parts", "other-scheme", "basic"],
)
async def test_missing_or_garbage_tokens_are_401(
    api: ApiClient, model: FakeOpenAI, authorization: str
) -> None:
    await refused(api, {"Authorization": authorization} if authorization else {}, model)


async def test_hs256_tokens_that_must_be_refused(api: ApiClient, model: FakeOpenAI) -> None:
    user_id, _ = api.new_user()
    other_id, _ = api.new_user()
    valid = api.token_for(user_id)

    head, payload, signature = valid.split(".")
    # Someone else's claims under this token's signature.
    other_payload = api.token_for(other_id).split(".")[1]
    await refused(api, bearer(f"{head}.{other_payload}.{signature}"), model)
    # A signature that is not this token's.
    flipped = ("A" if signature[0] != "A" else "B") + signature[1:]
    await refused(api, bearer(f"{head}.{payload}.{flipped}"), model)
    await refused(api, bearer(f"{head}.{payload}."), model)
    # Signed with another secret.
    await refused(api, bearer(devtokens.mint("another-secret-" + "x" * 32, user_id)), model)
    # alg=none, with and without a signature.
    claims = claims_for(user_id)
    await refused(api, bearer(hand_made_token({"alg": "none", "typ": "JWT"}, claims, None)), model)
    await refused(api, bearer(hand_made_token({"alg": "none"}, claims, JWT_SECRET.encode())), model)
    # The right secret under an algorithm name we do not accept.
    await refused(
        api, bearer(hand_made_token({"alg": "HS512"}, claims, JWT_SECRET.encode())), model
    )


@pytest.mark.parametrize(
    ("claims", "reason"),
    [
        ({"ttl_seconds": -3600}, "expired"),
        ({"aud": "somebody-else"}, "audience"),
        ({"aud": ["other", "more"]}, "audience"),
        ({"role": "anon"}, "role"),
        ({"role": "service_role"}, "role"),
        ({"sub": "not-a-uuid"}, "subject"),
        ({"sub": ""}, "subject"),
    ],
    ids=["expired", "wrong-aud", "aud-list", "anon", "service-role", "sub-not-uuid", "sub-empty"],
)
async def test_tokens_with_wrong_claims_are_401(
    api: ApiClient, model: FakeOpenAI, claims: dict[str, Any], reason: str
) -> None:
    user_id, _ = api.new_user()
    body = await refused(api, bearer(api.token_for(user_id, **claims)), model)
    assert body["detail"]


@pytest.mark.parametrize("missing", ["exp", "sub", "aud", "role"])
async def test_tokens_missing_a_required_claim_are_401(
    api: ApiClient, model: FakeOpenAI, missing: str
) -> None:
    user_id, _ = api.new_user()
    claims = claims_for(user_id)
    del claims[missing]
    await refused(api, bearer(jwt.encode(claims, JWT_SECRET, algorithm="HS256")), model)


@pytest.mark.parametrize("use_memory", [True, False])
async def test_a_deleted_users_token_is_401(
    api: ApiClient, model: FakeOpenAI, admin: psycopg.Connection, use_memory: bool
) -> None:
    user_id, auth = api.new_user()
    await chat(api, auth, "before")
    admin.execute("delete from auth.users where id = %s", (user_id,))
    calls = model.calls
    r = await api.post("/chat", json={"message": "after", "use_memory": use_memory}, headers=auth)
    assert_error(r, 401, "unauthorized")
    assert model.calls == calls
    count = admin.execute(
        "select count(*) from public.chat_sessions where user_id = %s", (user_id,)
    ).fetchone()
    assert count == (0,)


async def test_a_token_for_a_user_that_never_existed_is_401(
    api: ApiClient, model: FakeOpenAI
) -> None:
    await refused(api, bearer(api.token_for(uuid.uuid4())), model)


# -------------------------------------------------------------- JWKS


class JwksServer:
    """Serves a JWKS at /auth/v1/.well-known/jwks.json on a free loopback port.

    `status`, `body` (instead of the key set) and `delay` (before answering)
    make it fail as an auth server in trouble would."""

    def __init__(self) -> None:
        self.keys: list[dict[str, Any]] = []
        self.hits = 0
        self.last_hit_at = 0.0  # time.perf_counter() when the last request came
        self.status = 200
        self.body: bytes | None = None
        self.delay = 0.0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                if self.path != JWKS_PATH:
                    self.send_error(404)
                    return
                server.last_hit_at = time.perf_counter()
                server.hits += 1
                time.sleep(server.delay)
                data = server.body
                if data is None:
                    data = json.dumps({"keys": list(server.keys)}).encode()
                try:
                    self.send_response(server.status)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up waiting (the timeout case)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_port}"

    def recover(self) -> None:
        self.status, self.body, self.delay = 200, None, 0.0

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class SigningKey:
    def __init__(self, algorithm: str) -> None:
        self.algorithm = algorithm
        self.kid = f"{algorithm.lower()}-{uuid.uuid4().hex[:8]}"
        self.private: Any
        if algorithm == "ES256":
            self.private = ec.generate_private_key(ec.SECP256R1())
            jwk = ECAlgorithm.to_jwk(self.private.public_key(), as_dict=True)
        else:
            self.private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
            jwk = RSAAlgorithm.to_jwk(self.private.public_key(), as_dict=True)
        self.jwk = {**jwk, "kid": self.kid, "alg": algorithm, "use": "sig", "key_ops": ["verify"]}

    @property
    def public_pem(self) -> bytes:
        return bytes(
            self.private.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )

    def sign(self, claims: dict[str, Any], kid: str | None = None) -> str:
        return jwt.encode(
            claims, self.private, algorithm=self.algorithm, headers={"kid": kid or self.kid}
        )


@pytest.fixture(scope="module")
def es256() -> SigningKey:
    return SigningKey("ES256")


@pytest.fixture(scope="module")
def rs256() -> SigningKey:
    return SigningKey("RS256")


@pytest.fixture
def jwks(es256: SigningKey, rs256: SigningKey) -> Iterator[JwksServer]:
    server = JwksServer()
    server.keys = [es256.jwk, rs256.jwk]
    yield server
    server.close()


@pytest.fixture
async def jwks_apps(
    database_url: str, model: FakeOpenAI, jwks: JwksServer
) -> AsyncIterator[Callable[..., ApiClient]]:
    """Apps of a project with asymmetric signing keys and no JWT secret; keyword
    arguments configure the app's TokenVerifier (cache lifespan, refetch cooldown)."""
    settings = make_settings(
        database_url, model.url, supabase_url=jwks.url, supabase_jwt_secret=None
    )
    clients: list[ApiClient] = []

    def build(**verifier_options: float) -> ApiClient:
        state = bootstrap.services(settings)
        state.verifier = TokenVerifier(settings, **verifier_options)
        clients.append(ApiClient(settings, app=create_app(settings, state=state)))
        return clients[-1]

    yield build
    for client in clients:
        await client.aclose()


@pytest.fixture
def jwks_api(jwks_apps: Callable[..., ApiClient]) -> ApiClient:
    """The app as deployed: default key caching."""
    return jwks_apps()


@pytest.fixture
def user_id(users: UserFactory) -> uuid.UUID:
    return users.create().user_id


def issuer(jwks: JwksServer) -> str:
    return f"{jwks.url}/auth/v1"


async def test_es256_and_rs256_tokens_are_accepted_and_keys_cached(
    jwks_api: ApiClient,
    model: FakeOpenAI,
    jwks: JwksServer,
    es256: SigningKey,
    rs256: SigningKey,
    user_id: uuid.UUID,
) -> None:
    claims = claims_for(user_id, iss=issuer(jwks))
    first = await chat(jwks_api, bearer(es256.sign(claims)), "one")
    assert jwks.hits == 1
    await chat(jwks_api, bearer(rs256.sign(claims)), "two", session_id=first["session_id"])
    await chat(jwks_api, bearer(es256.sign(claims)), "three", session_id=first["session_id"])
    assert jwks.hits == 1  # one fetch served all three
    assert model.calls == 3


async def test_an_unknown_kid_refetches_the_keys_once(
    jwks_apps: Callable[..., ApiClient],
    model: FakeOpenAI,
    jwks: JwksServer,
    es256: SigningKey,
    user_id: uuid.UUID,
) -> None:
    jwks_api = jwks_apps(jwks_refetch_cooldown=0)
    claims = claims_for(user_id, iss=issuer(jwks))
    await chat(jwks_api, bearer(es256.sign(claims)), "before rotation")
    assert jwks.hits == 1

    rotated = SigningKey("ES256")
    jwks.keys = [*jwks.keys, rotated.jwk]
    await chat(jwks_api, bearer(rotated.sign(claims)), "with the new key")
    assert jwks.hits == 2
    await chat(jwks_api, bearer(rotated.sign(claims)), "new key again")
    await chat(jwks_api, bearer(es256.sign(claims)), "old key still valid")
    assert jwks.hits == 2

    # A key that was never published: refetched, still unknown, refused.
    stranger = SigningKey("ES256")
    await refused(jwks_api, bearer(stranger.sign(claims)), model)
    assert jwks.hits == 3
    # A published kid with another key's signature.
    await refused(jwks_api, bearer(stranger.sign(claims, kid=es256.kid)), model)


async def test_unknown_kids_refetch_at_most_once_per_cooldown(
    jwks_api: ApiClient,
    model: FakeOpenAI,
    jwks: JwksServer,
    es256: SigningKey,
    user_id: uuid.UUID,
) -> None:
    """Right after a fetch, made-up kids do not make every request fetch the keys."""
    claims = claims_for(user_id, iss=issuer(jwks))
    await chat(jwks_api, bearer(es256.sign(claims)), "fetches the keys")
    for _ in range(3):
        await refused(jwks_api, bearer(SigningKey("ES256").sign(claims)), model)
    assert jwks.hits == 1


async def test_a_key_removed_from_the_set_stops_working_after_the_cache_lifespan(
    jwks_apps: Callable[..., ApiClient],
    model: FakeOpenAI,
    jwks: JwksServer,
    es256: SigningKey,
    rs256: SigningKey,
    user_id: uuid.UUID,
) -> None:
    jwks_api = jwks_apps(jwks_lifespan=0.3)
    claims = claims_for(user_id, iss=issuer(jwks))
    await chat(jwks_api, bearer(es256.sign(claims)), "before revocation")
    jwks.keys = [rs256.jwk]  # es256 revoked
    await asyncio.sleep(0.5)
    await refused(jwks_api, bearer(es256.sign(claims)), model)
    await chat(jwks_api, bearer(rs256.sign(claims)), "the other key still works")


@pytest.mark.parametrize(
    "iss",
    ["https://evil.example/auth/v1", "{url}", "{url}/auth/v1/", None],
    ids=["other-project", "no-path", "trailing-slash", "missing"],
)
async def test_a_wrong_issuer_is_401(
    jwks_api: ApiClient,
    model: FakeOpenAI,
    jwks: JwksServer,
    es256: SigningKey,
    user_id: uuid.UUID,
    iss: str | None,
) -> None:
    claims = claims_for(user_id)
    if iss is not None:
        claims["iss"] = iss.format(url=jwks.url)
    await refused(jwks_api, bearer(es256.sign(claims)), model)


async def test_jwks_tokens_with_wrong_claims_are_401(
    jwks_api: ApiClient,
    model: FakeOpenAI,
    jwks: JwksServer,
    rs256: SigningKey,
    user_id: uuid.UUID,
) -> None:
    iss = issuer(jwks)
    for extra in ({"role": "anon"}, {"aud": "other"}, {"exp": int(time.time()) - 60}):
        await refused(jwks_api, bearer(rs256.sign(claims_for(user_id, iss=iss, **extra))), model)


async def test_hs256_signed_with_the_public_key_is_refused(
    jwks_api: ApiClient,
    model: FakeOpenAI,
    jwks: JwksServer,
    rs256: SigningKey,
    es256: SigningKey,
    user_id: uuid.UUID,
) -> None:
    """The algorithm-confusion attack: the public key used as an HMAC secret."""
    claims = claims_for(user_id, iss=issuer(jwks))
    for key in (rs256, es256):
        for kid in (key.kid, None):
            header = {"alg": "HS256", "typ": "JWT", **({"kid": kid} if kid else {})}
            for secret in (key.public_pem, json.dumps(key.jwk).encode()):
                await refused(jwks_api, bearer(hand_made_token(header, claims, secret)), model)


async def test_hs256_is_refused_when_no_secret_is_configured(
    jwks_api: ApiClient, model: FakeOpenAI, jwks: JwksServer, user_id: uuid.UUID
) -> None:
    claims = claims_for(user_id, iss=issuer(jwks))
    for secret in (JWT_SECRET, ""):
        token = hand_made_token({"alg": "HS256", "typ": "JWT"}, claims, secret.encode())
        await refused(jwks_api, bearer(token), model)


async def keys_unavailable(client: ApiClient, token: str, model: FakeOpenAI) -> None:
    """503 auth_unavailable with Retry-After: the client should retry, not sign out."""
    calls = model.calls
    r = await client.post("/chat", json={"message": "hi"}, headers=bearer(token))
    body = assert_error(r, 503, "auth_unavailable")
    assert "retry" in body["detail"]
    assert int(r.headers["retry-after"]) > 0
    assert "www-authenticate" not in r.headers
    assert model.calls == calls


async def test_an_unreachable_jwks_is_503_not_401(
    database_url: str, model: FakeOpenAI, es256: SigningKey, user_id: uuid.UUID
) -> None:
    server = JwksServer()
    server.close()  # nobody listens there any more
    api = ApiClient(
        make_settings(database_url, model.url, supabase_url=server.url, supabase_jwt_secret=None)
    )
    try:
        token = es256.sign(claims_for(user_id, iss=f"{server.url}/auth/v1"))
        await keys_unavailable(api, token, model)
    finally:
        await api.aclose()


JWKS_FAILURES: dict[str, dict[str, Any]] = {
    "timeout": {"delay": 6.0},
    "500": {"status": 500},
    "502": {"status": 502},
    "503": {"status": 503, "body": b'{"message": "upstream unavailable"}'},
    "html": {"body": b"<html><body>Down for maintenance</body></html>"},
    "not-utf8": {"body": b"\xff\xfe\xfa"},
    "json-array": {"body": b"[]"},
    "json-string": {"body": b'"keys"'},
    "no-keys-member": {"body": b'{"error": "down"}'},
    "keys-not-a-list": {"body": b'{"keys": "none"}'},
    "empty-key-set": {"body": b'{"keys": []}'},
    "no-usable-key": {"body": b'{"keys": [{"kty": "nope", "kid": "x"}]}'},
}


@pytest.mark.parametrize("failure", JWKS_FAILURES.values(), ids=JWKS_FAILURES.keys())
async def test_signing_keys_that_cannot_be_fetched_are_503_until_they_can(
    jwks_apps: Callable[..., ApiClient],
    model: FakeOpenAI,
    jwks: JwksServer,
    es256: SigningKey,
    user_id: uuid.UUID,
    failure: dict[str, Any],
) -> None:
    # Short enough for the slow case, long enough for the fetch once the keys
    # are back on a loaded machine.
    api = jwks_apps(jwks_timeout=3.0)
    token = es256.sign(claims_for(user_id, iss=issuer(jwks)))
    for name, value in failure.items():
        setattr(jwks, name, value)
    await keys_unavailable(api, token, model)
    await keys_unavailable(api, token, model)  # a failure is not cached
    jwks.recover()
    await chat(api, bearer(token), "the keys are back")


async def test_cached_keys_keep_working_while_the_jwks_is_down(
    jwks_api: ApiClient,
    model: FakeOpenAI,
    jwks: JwksServer,
    es256: SigningKey,
    user_id: uuid.UUID,
) -> None:
    token = es256.sign(claims_for(user_id, iss=issuer(jwks)))
    await chat(jwks_api, bearer(token), "fetches the keys")
    jwks.status = 500
    await chat(jwks_api, bearer(token), "from the cached keys")
    assert jwks.hits == 1


async def test_fetching_the_key_set_holds_up_no_other_request(
    jwks_api: ApiClient, jwks: JwksServer, es256: SigningKey, user_id: uuid.UUID
) -> None:
    """Verification runs on the event loop (no thread per request), except
    when it may fetch the project's keys: that request waits in a thread, and
    the others go on meanwhile."""
    jwks.delay = 1.0
    token = es256.sign(claims_for(user_id, iss=issuer(jwks)))
    slow = asyncio.create_task(chat(jwks_api, bearer(token), "waits for the keys"))
    while jwks.hits == 0:  # the fetch has begun
        await asyncio.sleep(0.01)
    assert (await jwks_api.get("/health")).status_code == 200
    # Answered while the key set was still on its way (1 s).
    assert time.perf_counter() - jwks.last_hit_at < 0.5
    assert not slow.done()
    await slow
    assert jwks.hits == 1


def test_a_verifier_knows_when_a_token_needs_the_key_set_fetched(
    jwks: JwksServer, es256: SigningKey, user_id: uuid.UUID
) -> None:
    settings = make_settings(UNUSED_DATABASE, "http://127.0.0.1:9", supabase_url=jwks.url)
    verifier = TokenVerifier(settings, jwks_lifespan=0.3)
    claims = claims_for(user_id, iss=issuer(jwks))
    token = es256.sign(claims)
    hs256 = jwt.encode(claims, JWT_SECRET, algorithm="HS256")
    assert not verifier.needs_key_fetch(hs256)  # the secret verifies it
    assert not verifier.needs_key_fetch("not a token")  # refused from its header
    assert verifier.needs_key_fetch(token)  # nothing cached yet
    verifier.verify(token)
    assert not verifier.needs_key_fetch(token)  # its kid is in the cached set
    assert verifier.needs_key_fetch(SigningKey("ES256").sign(claims))  # a kid not in it
    time.sleep(0.35)
    assert verifier.needs_key_fetch(token)  # the cached set has expired
    assert jwks.hits == 1


async def test_with_both_secret_and_jwks_each_token_uses_its_own_path(
    database_url: str,
    model: FakeOpenAI,
    jwks: JwksServer,
    es256: SigningKey,
    user_id: uuid.UUID,
) -> None:
    api = ApiClient(make_settings(database_url, model.url, supabase_url=jwks.url))
    try:
        iss = issuer(jwks)
        await chat(api, bearer(api.token_for(user_id, issuer=iss)), "hs256")
        assert jwks.hits == 0
        await chat(api, bearer(es256.sign(claims_for(user_id, iss=iss))), "es256")
        assert jwks.hits == 1
        # With a project URL the issuer is checked on HS256 tokens too.
        await refused(api, bearer(api.token_for(user_id)), model)
    finally:
        await api.aclose()


# ------------------------------------------------- what a refusal says


def pyjwt_message(token: str, key: Any, algorithm: str = "HS256") -> str:
    """What PyJWT itself says about a token it refuses (never to be shown)."""
    try:
        jwt.decode(
            token,
            key,
            algorithms=[algorithm],
            audience="authenticated",
            options={"require": ["exp", "sub", "aud", "role"]},
        )
    except jwt.PyJWTError as exc:
        return str(exc)
    raise AssertionError("PyJWT accepted the token")


def now_plus(seconds: int) -> int:
    return int(time.time()) + seconds


def tampered(token: str) -> str:
    head, payload, signature = token.split(".")
    return f"{head}.{payload}.{'A' if signature[0] != 'A' else 'B'}{signature[1:]}"


@pytest.mark.parametrize(
    ("make_token", "says"),
    [
        (lambda u: devtokens.mint(JWT_SECRET, u, ttl_seconds=-3600), "has expired"),
        (lambda u: devtokens.mint(JWT_SECRET, u, nbf=now_plus(3600)), "not valid yet"),
        (lambda u: devtokens.mint(JWT_SECRET, u, aud="somebody-else"), "audience"),
        (lambda u: devtokens.mint("another-secret-" + "x" * 32, u), "not signed by this project"),
        (lambda u: "garbage", "malformed"),
        (lambda u: "a.b.c", "malformed"),
        (lambda u: tampered(devtokens.mint(JWT_SECRET, u)), "not signed by this project"),
        (
            lambda u: jwt.encode(
                {k: v for k, v in claims_for(u).items() if k != "exp"}, JWT_SECRET, "HS256"
            ),
            "no 'exp' claim",
        ),
    ],
    ids=[
        "expired",
        "not-yet-valid",
        "audience",
        "other-secret",
        "garbage",
        "three-parts",
        "tampered-signature",
        "missing-exp",
    ],
)
async def test_a_refusal_says_what_to_do_in_our_words_not_pyjwts(
    api: ApiClient, model: FakeOpenAI, make_token: Callable[[uuid.UUID], str], says: str
) -> None:
    user_id, _ = api.new_user()
    token = make_token(user_id)
    detail = (await refused(api, bearer(token), model))["detail"]
    assert says in detail
    assert pyjwt_message(token, JWT_SECRET) not in detail
    assert detail.endswith(".") and "Invalid access token" not in detail


async def test_each_kind_of_refusal_is_one_fixed_sentence(
    api: ApiClient, model: FakeOpenAI
) -> None:
    """The detail depends on how the token failed, not on what it contains."""
    user_id, _ = api.new_user()
    malformed = {
        (await refused(api, bearer(token), model))["detail"]
        for token in ("garbage", "a.b.c", "x.y", "ey.ey.ey", "a" * 500)
    }
    assert len(malformed) == 1
    other_secrets = {
        (await refused(api, bearer(devtokens.mint(secret * 4, user_id)), model))["detail"]
        for secret in ("first-secret", "second-secret", "third-secret")
    }
    assert len(other_secrets) == 1


async def test_jwks_refusals_say_what_to_do(
    jwks_api: ApiClient,
    model: FakeOpenAI,
    jwks: JwksServer,
    es256: SigningKey,
    user_id: uuid.UUID,
) -> None:
    stranger = SigningKey("ES256")
    unknown_kid = stranger.sign(claims_for(user_id, iss=issuer(jwks)))
    detail = (await refused(jwks_api, bearer(unknown_kid), model))["detail"]
    assert "not signed by this project" in detail and stranger.kid not in detail
    other_project = es256.sign(claims_for(user_id, iss="https://other.example/auth/v1"))
    detail = (await refused(jwks_api, bearer(other_project), model))["detail"]
    assert "another Supabase project" in detail and "other.example" not in detail


# ------------------------------------------------------- anonymous users


async def test_anonymous_sign_ins_are_401_by_default(api: ApiClient, model: FakeOpenAI) -> None:
    user_id, _ = api.new_user()
    token = api.token_for(user_id, is_anonymous=True)
    detail = (await refused(api, bearer(token), model))["detail"]
    assert "Anonymous" in detail and "sign in with an account" in detail
    # A signed-in user's token says is_anonymous: false (devtokens mints it so).
    await chat(api, bearer(api.token_for(user_id, is_anonymous=False)), "a real account")


@pytest.mark.parametrize("value", ["true", 1], ids=["string", "number"])
async def test_an_is_anonymous_claim_that_is_not_false_counts_as_anonymous(
    api: ApiClient, model: FakeOpenAI, value: object
) -> None:
    user_id, _ = api.new_user()
    await refused(api, bearer(api.token_for(user_id, is_anonymous=value)), model)


async def test_anonymous_sign_ins_are_served_when_allowed(
    database_url: str, model: FakeOpenAI
) -> None:
    api = ApiClient(make_settings(database_url, model.url, allow_anonymous_users=True))
    try:
        user_id, _ = api.new_user()
        await chat(api, bearer(api.token_for(user_id, is_anonymous=True)), "as a guest")
        # Everything else is still checked.
        await refused(api, bearer(api.token_for(user_id, is_anonymous=True, role="anon")), model)
    finally:
        await api.aclose()
