"""`memchat login` / `memchat logout`: sign in to a deployed stack's Supabase
project, and which access token a command that calls the API sends.

`memchat login` signs in with Supabase Auth through the official `supabase`
client (the `cli` extra: `pip install 'memchat[cli]'`), by email and
password or by a one-time code sent by email, and keeps the session (its
access and refresh tokens, the project's URL and anon key, the API's URL)
in the user's config directory (`$XDG_CONFIG_HOME/memchat/session.json`,
by default `~/.config/memchat/`), readable by its owner only (0600, in a
0700 directory). A command that calls that API sends the session's access
token, refreshed first when it expires within REFRESH_MARGIN_SECONDS (the
new tokens are stored); a refresh the project refuses (the refresh token
expired, was revoked or used already) forgets the session and says to sign
in again. `memchat logout` revokes the session at the project (POST
/auth/v1/logout) and deletes the file, even when the project cannot be
reached (then it says so).

Which token a command sends (`api_token`): --token, else MEMCHAT_TOKEN,
else the stored sign-in when it is for the command's API URL, else, for an
API on this machine (`memchat dev`), a local dev token (`memchat token`).

Only these commands import `supabase` (never the Lambda handlers).
"""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from memchat.cli.base import Handled, add_described_command, err

if TYPE_CHECKING:
    import argparse

    from supabase import Client

    from memchat.cli.base import Subcommands

# A token that expires within this many seconds is refreshed before it is sent.
REFRESH_MARGIN_SECONDS = 60
SESSION_FILE = "session.json"
LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
INSTALL_HINT = "`memchat login` needs the `cli` extra: pip install 'memchat[cli]'"


# ------------------------------------------------------------ the session


@dataclass(frozen=True)
class SignIn:
    """A stored sign-in: the Supabase session and where it is used."""

    api_url: str  # the stack's API (its ApiUrl output), no trailing slash
    supabase_url: str
    anon_key: str  # the project's public (anon) key: Supabase Auth asks for it
    email: str
    user_id: str
    access_token: str
    refresh_token: str
    expires_at: int  # Unix seconds

    def expires_within(self, seconds: float) -> bool:
        return self.expires_at - time.time() <= seconds


def config_dir() -> Path:
    """memchat's directory in the user's config directory (XDG)."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "memchat"


def session_path() -> Path:
    return config_dir() / SESSION_FILE


def load() -> SignIn | None:
    """The stored sign-in, or None (none, or a file this version cannot read)."""
    try:
        data = json.loads(session_path().read_text(encoding="utf-8"))
        return SignIn(**data)
    except (OSError, ValueError, TypeError):
        return None


def save(sign_in: SignIn) -> Path:
    """Stores the sign-in, readable and writable by its owner only."""
    directory = config_dir()
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    directory.chmod(0o700)
    path = directory / SESSION_FILE
    partial = directory / f".{SESSION_FILE}.{os.getpid()}"
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # a file left by an earlier run keeps its own mode otherwise
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        json.dump(asdict(sign_in), out)
    os.replace(partial, path)  # whole or not at all
    return path


def forget() -> bool:
    """Deletes the stored sign-in; whether there was one."""
    try:
        session_path().unlink()
    except FileNotFoundError:
        return False
    return True


def same_api(a: str, b: str) -> bool:
    return a.rstrip("/") == b.rstrip("/")


def is_local(url: str) -> bool:
    return (urlsplit(url).hostname or "") in LOCAL_HOSTS


# ---------------------------------------------------- which token to send


@dataclass(frozen=True)
class ApiToken:
    token: str
    source: str  # "option", "env", "login" or "local": where it came from

    def refused_hint(self, url: str) -> str:
        """What to do when the API at `url` refused this token (a 401)."""
        if self.source == "login":
            return "sign in again: memchat login"
        if self.source == "local":
            return (
                f"the API at {url} does not take local dev tokens: for a deployed stack,"
                " sign in with `memchat login`; for `memchat dev`, run this command where it"
                " runs (the same .memchat/ and SUPABASE_JWT_SECRET)"
            )
        given = "--token" if self.source == "option" else "MEMCHAT_TOKEN"
        return (
            f"the token from {given} was refused: get a new one with `memchat token` (a local"
            " API: memchat dev) or sign in with `memchat login` (a deployed stack)"
        )


def api_token(url: str, token: str | None) -> ApiToken:
    """The token to send to the API at `url` (see the module's docstring);
    `Handled` (said why) when there is none."""
    if token:
        return ApiToken(token, "option")
    if os.environ.get("MEMCHAT_TOKEN"):
        return ApiToken(os.environ["MEMCHAT_TOKEN"], "env")
    stored = load()
    if stored is not None and same_api(stored.api_url, url):
        return ApiToken(fresh(stored).access_token, "login")
    if is_local(url):
        from memchat.cli.token import DEFAULT_EMAIL, mint_local_token

        return ApiToken(mint_local_token(None, DEFAULT_EMAIL, 3600 * 12), "local")
    signed_in = f" (you are signed in to {stored.api_url})" if stored else ""
    err(
        f"! no access token for {url}{signed_in}: sign in with"
        f" `memchat login --api-url {url}`, or pass --token"
    )
    raise Handled()


def fresh(sign_in: SignIn) -> SignIn:
    """The sign-in, its access token refreshed (and stored) when it expires
    within REFRESH_MARGIN_SECONDS; `Handled` when the project refuses."""
    if not sign_in.expires_within(REFRESH_MARGIN_SECONDS):
        return sign_in
    client = _client(sign_in.supabase_url, sign_in.anon_key)
    from supabase_auth.errors import AuthApiError, AuthError

    try:
        response = client.auth.refresh_session(sign_in.refresh_token)
    except AuthError as exc:
        # Refused (expired, revoked, used already): the sign-in is over. The
        # project's own trouble (5xx, the network): it may still be good.
        if isinstance(exc, AuthApiError) and exc.status < 500:
            forget()
            err(
                f"! your sign-in to {sign_in.supabase_url} has ended ({exc.message}):"
                " sign in again with `memchat login`"
            )
        else:
            err(f"! cannot refresh the sign-in at {sign_in.supabase_url}: {exc.message}; try again")
        raise Handled() from None
    return _store(response.session, sign_in.api_url, sign_in.supabase_url, sign_in.anon_key)


# ------------------------------------------------------------ the commands


def _client(supabase_url: str, anon_key: str) -> Client:
    """The official client, keeping nothing itself (memchat stores the session)."""
    try:
        from supabase import ClientOptions, create_client
    except ImportError:
        err(f"! {INSTALL_HINT}")
        raise Handled() from None
    options = ClientOptions(auto_refresh_token=False, persist_session=False)
    return create_client(supabase_url, anon_key, options)


def _store(session: Any, api_url: str, supabase_url: str, anon_key: str) -> SignIn:
    """Stores a session the project returned; the stored sign-in."""
    if session is None:
        err("! Supabase Auth returned no session (is the email address confirmed?)")
        raise Handled()
    expires_at = session.expires_at or int(time.time()) + int(session.expires_in)
    sign_in = SignIn(
        api_url=api_url.rstrip("/"),
        supabase_url=supabase_url.rstrip("/"),
        anon_key=anon_key,
        email=str(session.user.email or ""),
        user_id=str(session.user.id),
        access_token=session.access_token,
        refresh_token=session.refresh_token,
        expires_at=int(expires_at),
    )
    save(sign_in)
    return sign_in


def _required(value: str | None, option: str, variable: str) -> str:
    if not value:
        err(f"! {option} is required (or set {variable})")
        raise Handled()
    return value


def cmd_login(args: argparse.Namespace) -> int:
    supabase_url = _required(args.supabase_url, "--supabase-url", "SUPABASE_URL")
    anon_key = _required(args.anon_key, "--anon-key", "SUPABASE_ANON_KEY")
    api_url = _required(args.api_url, "--api-url", "MEMCHAT_URL")
    email = args.email or input("email: ").strip()
    client = _client(supabase_url, anon_key)
    from supabase_auth.errors import AuthApiError, AuthError

    try:
        if args.otp:
            client.auth.sign_in_with_otp({"email": email, "options": {"should_create_user": False}})
            code = input(f"the code sent to {email}: ").strip()
            response = client.auth.verify_otp({"email": email, "token": code, "type": "email"})
        else:
            password = (
                sys.stdin.readline().rstrip("\r\n")
                if args.password_stdin
                else getpass.getpass(f"password for {email}: ")
            )
            response = client.auth.sign_in_with_password({"email": email, "password": password})
    except AuthApiError as exc:
        err(f"! sign-in refused: {exc.message}")
        return 1
    except AuthError as exc:
        err(f"! cannot sign in at {supabase_url}: {exc.message}")
        return 1
    sign_in = _store(response.session, api_url, supabase_url, anon_key)
    print(f"signed in as {sign_in.email or sign_in.user_id} for {sign_in.api_url}")
    print(f"session stored in {session_path()} (owner only); `memchat logout` forgets it")
    return 0


def cmd_logout(args: argparse.Namespace) -> int:
    stored = load()
    if stored is None:
        print("not signed in")
        return 0
    client = _client(stored.supabase_url, stored.anon_key)
    from supabase_auth.errors import AuthError

    revoked = True
    try:
        client.auth.set_session(stored.access_token, stored.refresh_token)
        client.auth.sign_out({"scope": "local"})
    except AuthError as exc:
        revoked = False
        err(f"! could not revoke the session at {stored.supabase_url}: {exc.message}")
    finally:
        forget()
    with contextlib.suppress(OSError):
        config_dir().rmdir()  # only if nothing else is kept there
    print(f"signed out: {session_path()} deleted" + ("" if revoked else " (only here)"))
    return 0 if revoked else 1


def register(commands: Subcommands) -> None:
    login = add_described_command(
        commands, "login", "sign in to a deployed stack (Supabase Auth)", __doc__ or ""
    )
    login.add_argument(
        "--api-url", default=os.environ.get("MEMCHAT_URL"), help="the stack's ApiUrl output"
    )
    login.add_argument("--supabase-url", default=os.environ.get("SUPABASE_URL"))
    login.add_argument(
        "--anon-key", default=os.environ.get("SUPABASE_ANON_KEY"), help="the project's anon key"
    )
    login.add_argument("--email", default=None, help="asked for when not given")
    login.add_argument("--otp", action="store_true", help="sign in with a code sent by email")
    login.add_argument(
        "--password-stdin", action="store_true", help="read the password from stdin's first line"
    )
    login.set_defaults(func=cmd_login)
    logout = commands.add_parser("logout", help="forget the stored sign-in (and revoke it)")
    logout.set_defaults(func=cmd_logout)
