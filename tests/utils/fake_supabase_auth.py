"""A local stand-in for Supabase Auth's HTTP API (GoTrue), on a free loopback
port, for `memchat login`'s tests: the official `supabase` client talks to it
over HTTP as it would to a project's `<SUPABASE_URL>/auth/v1`.

It serves the documented endpoints the CLI uses, with GoTrue's shapes:
`POST /token?grant_type=password` (email and password), `POST
/token?grant_type=refresh_token` (each refresh token used once: it rotates),
`POST /otp` then `POST /verify` (an email code, kept in `codes` for the test
to read, as the email would carry it), `GET /user`, and `POST /logout`
(revokes the session's refresh tokens). Every request needs the `apikey`
header (the anon key). Errors are GoTrue's JSON (`code`, `error_code`,
`msg`): 400 `invalid_credentials` for a wrong password, 500 for
everything while `failing`, 400
`refresh_token_not_found` / `refresh_token_already_used` / `session_expired`,
403 `otp_expired` for a wrong code, 401 `bad_jwt`.

The access tokens are HS256 JWTs signed with the secret the API under test
verifies (as a Supabase project's are), for users that exist in the test
database's auth.users: memchat accepts them as it would a real project's.
`requests` records (method, path, grant_type) of each request.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import jwt

ANON_KEY = "anon-key-of-the-stand-in"
PREFIX = "/auth/v1"


@dataclass
class _Refresh:
    user_id: str
    session_id: str
    used: bool = False
    revoked: bool = False


@dataclass
class FakeSupabaseAuth:
    jwt_secret: str
    access_ttl: int = 3600  # seconds: the access tokens' lifetime
    users: dict[str, tuple[str, str]] = field(default_factory=dict)  # email -> (password, id)
    codes: dict[str, str] = field(default_factory=dict)  # email -> the last code sent
    requests: list[tuple[str, str, str]] = field(default_factory=list)
    failing: bool = False  # True: every request is a 500 (the project in trouble)
    _refresh: dict[str, _Refresh] = field(default_factory=dict)
    _expired_sessions: set[str] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def add_user(self, email: str, password: str, user_id: uuid.UUID) -> None:
        self.users[email] = (password, str(user_id))

    def expire_sessions(self) -> None:
        """Every session so far ends (its refresh tokens answer `session_expired`)."""
        with self._lock:
            self._expired_sessions |= {r.session_id for r in self._refresh.values()}

    def grants(self, grant_type: str) -> int:
        return sum(
            1 for _, path, grant in self.requests if path == "/token" and grant == grant_type
        )

    def live_refresh_tokens(self, user_id: uuid.UUID) -> list[str]:
        with self._lock:
            return [
                token
                for token, r in self._refresh.items()
                if r.user_id == str(user_id) and not (r.used or r.revoked)
            ]

    # ---------------------------------------------------------- answers

    def answer(
        self, method: str, path: str, query: dict[str, str], body: dict[str, Any], bearer: str
    ) -> tuple[int, dict[str, Any] | None]:
        if method == "POST" and path == "/token":
            if query.get("grant_type") == "password":
                return self._password(body)
            if query.get("grant_type") == "refresh_token":
                return self._refreshed(str(body.get("refresh_token", "")))
            return _error(400, "validation_failed", "unsupported_grant_type")
        if method == "POST" and path == "/otp":
            return self._send_code(body)
        if method == "POST" and path == "/verify":
            return self._verify(body)
        if method == "GET" and path == "/user":
            claims = self._claims(bearer)
            if claims is None:
                return _error(401, "bad_jwt", "invalid JWT: unable to parse or verify signature")
            return 200, _user(claims["sub"], claims["email"])
        if method == "POST" and path == "/logout":
            claims = self._claims(bearer)
            if claims is None:
                return _error(401, "bad_jwt", "invalid JWT: unable to parse or verify signature")
            with self._lock:
                for r in self._refresh.values():
                    if r.session_id == claims["session_id"]:
                        r.revoked = True
            return 204, None
        return _error(404, "not_found", "Not Found")

    def _password(self, body: dict[str, Any]) -> tuple[int, dict[str, Any] | None]:
        email = str(body.get("email", ""))
        known = self.users.get(email)
        if known is None or known[0] != body.get("password"):
            return _error(400, "invalid_credentials", "Invalid login credentials")
        return 200, self._session(known[1], email, str(uuid.uuid4()))

    def _refreshed(self, token: str) -> tuple[int, dict[str, Any] | None]:
        with self._lock:
            r = self._refresh.get(token)
            if r is None or r.revoked:
                return _error(
                    400, "refresh_token_not_found", "Invalid Refresh Token: Refresh Token Not Found"
                )
            if r.session_id in self._expired_sessions:
                return _error(400, "session_expired", "Session Expired")
            if r.used:
                return _error(
                    400, "refresh_token_already_used", "Invalid Refresh Token: Already Used"
                )
            r.used = True
        email = next(e for e, (_, uid) in self.users.items() if uid == r.user_id)
        return 200, self._session(r.user_id, email, r.session_id)

    def _send_code(self, body: dict[str, Any]) -> tuple[int, dict[str, Any] | None]:
        email = str(body.get("email", ""))
        if email not in self.users and body.get("create_user") is False:
            return _error(422, "otp_disabled", "Signups not allowed for otp")
        self.codes[email] = f"{secrets.randbelow(10**6):06d}"
        return 200, {}

    def _verify(self, body: dict[str, Any]) -> tuple[int, dict[str, Any] | None]:
        email = str(body.get("email", ""))
        code = self.codes.get(email)
        if body.get("type") != "email" or code is None or body.get("token") != code:
            return _error(403, "otp_expired", "Token has expired or is invalid")
        del self.codes[email]  # a code is good once
        return 200, self._session(self.users[email][1], email, str(uuid.uuid4()))

    def _session(self, user_id: str, email: str, session_id: str) -> dict[str, Any]:
        now = int(time.time())
        claims = {
            "sub": user_id,
            "aud": "authenticated",
            "role": "authenticated",
            "email": email,
            "iat": now,
            "exp": now + self.access_ttl,
            "session_id": session_id,
            "is_anonymous": False,
            # Each token its own, as a refresh a second later would make it
            # (two minted in one second would otherwise be the same string).
            "jti": str(uuid.uuid4()),
        }
        refresh = secrets.token_urlsafe(16)
        with self._lock:
            self._refresh[refresh] = _Refresh(user_id, session_id)
        return {
            "access_token": jwt.encode(claims, self.jwt_secret, algorithm="HS256"),
            "token_type": "bearer",
            "expires_in": self.access_ttl,
            "expires_at": now + self.access_ttl,
            "refresh_token": refresh,
            "user": _user(user_id, email),
        }

    def _claims(self, bearer: str) -> dict[str, Any] | None:
        try:
            claims: dict[str, Any] = jwt.decode(
                bearer, self.jwt_secret, algorithms=["HS256"], audience="authenticated"
            )
        except jwt.PyJWTError:
            return None
        return claims


def _user(user_id: str, email: str) -> dict[str, Any]:
    return {
        "id": user_id,
        "aud": "authenticated",
        "role": "authenticated",
        "email": email,
        "app_metadata": {"provider": "email", "providers": ["email"]},
        "user_metadata": {},
        "created_at": "2026-01-01T00:00:00Z",
    }


def _error(status: int, code: str, message: str) -> tuple[int, dict[str, Any]]:
    return status, {"code": status, "error_code": code, "msg": message}


def _handler(auth: FakeSupabaseAuth) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            self._answer("GET")

        def do_POST(self) -> None:
            self._answer("POST")

        def _answer(self, method: str) -> None:
            url = urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            query = {k: v[-1] for k, v in parse_qs(url.query).items()}
            path = url.path.removeprefix(PREFIX)
            auth.requests.append((method, path, query.get("grant_type", "")))
            body: dict[str, Any] | None
            if auth.failing:
                status, body = _error(500, "unexpected_failure", "Unexpected failure")
            elif self.headers.get("apikey") != ANON_KEY:
                status, body = 401, {"message": "Invalid API key"}
            else:
                authorization = self.headers.get("Authorization", "")
                bearer = authorization.removeprefix("Bearer ").strip()
                status, body = auth.answer(method, path, query, json.loads(raw or b"{}"), bearer)
            data = b"" if body is None else json.dumps(body).encode()
            self.send_response(status)
            if body is not None:
                self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Handler
