"""`memchat login` / `memchat logout` with the official `supabase` client
against a local stand-in for Supabase Auth's HTTP API
(tests/utils/fake_supabase_auth.py), and the commands that then call the
API (`memchat chat`, `memchat import`) with the stored sign-in: the real
commands in subprocesses, the real `memchat dev` (the test database)."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from tests.utils.dev_server import JWT_SECRET, MEMCHAT, DevServer
from tests.utils.fake_openai import FakeOpenAI
from tests.utils.fake_supabase_auth import ANON_KEY, FakeSupabaseAuth
from tests.utils.users import create_user

PASSWORD = "correct horse battery staple"


@dataclass
class Account:
    email: str
    user_id: uuid.UUID
    env: dict[str, str]  # the commands' environment: a config directory of its own
    config: Path  # $XDG_CONFIG_HOME

    @property
    def session_file(self) -> Path:
        return self.config / "memchat" / "session.json"

    def stored(self) -> dict[str, object]:
        data: dict[str, object] = json.loads(self.session_file.read_text())
        return data


@pytest.fixture
def auth() -> Iterator[FakeSupabaseAuth]:
    server = FakeSupabaseAuth(JWT_SECRET)
    yield server
    server.close()


@pytest.fixture
def account(auth: FakeSupabaseAuth, dev: DevServer, tmp_path: Path) -> Account:
    """A user of the project (in auth.users, with a password at the stand-in)."""
    user_id = uuid.uuid4()
    email = f"{user_id.hex[:8]}@example.test"
    create_user(user_id, email)
    auth.add_user(email, PASSWORD, user_id)
    config = tmp_path / "config"
    env = {k: v for k, v in dev.env.items() if k != "MEMCHAT_TOKEN"}
    env.update(XDG_CONFIG_HOME=str(config), HOME=str(tmp_path))
    return Account(email, user_id, env, config)


def memchat(account: Account, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*MEMCHAT, *args],
        input=stdin,
        env=account.env,
        cwd=account.config.parent,
        capture_output=True,
        text=True,
        timeout=120,
    )


def login(
    account: Account, auth: FakeSupabaseAuth, dev: DevServer, password: str = PASSWORD
) -> subprocess.CompletedProcess[str]:
    """`memchat login` by email and password (read from stdin)."""
    return memchat(
        account,
        "login",
        "--api-url",
        dev.url,
        "--supabase-url",
        auth.url,
        "--anon-key",
        ANON_KEY,
        "--email",
        account.email,
        "--password-stdin",
        stdin=password + "\n",
    )


def stored_turns(admin: psycopg.Connection, user_id: uuid.UUID) -> list[str]:
    rows = admin.execute(
        "select message->'data'->>'content' from public.chat_message_history"
        " where user_id = %s and message->>'type' = 'human' order by id",
        (user_id,),
    ).fetchall()
    return [str(content) for (content,) in rows]


def test_login_stores_the_session_for_its_owner_only_and_chat_uses_it(
    auth: FakeSupabaseAuth,
    dev: DevServer,
    dev_model: FakeOpenAI,
    account: Account,
    admin: psycopg.Connection,
) -> None:
    result = login(account, auth, dev)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        f"signed in as {account.email} for {dev.url}",
        f"session stored in {account.session_file} (owner only); `memchat logout` forgets it",
    ]
    assert stat.S_IMODE(account.session_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(account.session_file.parent.stat().st_mode) == 0o700
    stored = account.stored()
    assert stored["user_id"] == str(account.user_id) and stored["api_url"] == dev.url
    assert stored["supabase_url"] == auth.url and stored["anon_key"] == ANON_KEY
    assert PASSWORD not in account.session_file.read_text()
    assert auth.grants("password") == 1

    chat = memchat(account, "chat", "--url", dev.url, stdin="hello from a sign-in\n")
    assert chat.returncode == 0, chat.stdout + chat.stderr
    assert "default> echo: hello from a sign-in" in chat.stdout
    assert stored_turns(admin, account.user_id) == ["hello from a sign-in"]
    assert auth.grants("refresh_token") == 0  # still fresh: not refreshed


def test_a_wrong_password_is_refused_and_nothing_is_stored(
    auth: FakeSupabaseAuth, dev: DevServer, account: Account
) -> None:
    result = login(account, auth, dev, password="wrong")
    assert result.returncode == 1
    assert result.stderr == "! sign-in refused: Invalid login credentials\n"
    assert not account.session_file.exists()


def test_an_access_token_about_to_expire_is_refreshed_before_it_is_sent(
    auth: FakeSupabaseAuth,
    dev: DevServer,
    dev_model: FakeOpenAI,
    account: Account,
    admin: psycopg.Connection,
) -> None:
    auth.access_ttl = 30  # within the CLI's refresh margin (60 s)
    assert login(account, auth, dev).returncode == 0
    first = account.stored()

    chat = memchat(account, "chat", "--url", dev.url, stdin="after a refresh\n")
    assert chat.returncode == 0, chat.stdout + chat.stderr
    assert auth.grants("refresh_token") == 1
    refreshed = account.stored()
    assert refreshed["refresh_token"] != first["refresh_token"]  # rotated, and stored
    assert refreshed["access_token"] != first["access_token"]
    assert stat.S_IMODE(account.session_file.stat().st_mode) == 0o600
    assert stored_turns(admin, account.user_id) == ["after a refresh"]

    # The old refresh token was used: only the stored one is live.
    assert auth.live_refresh_tokens(account.user_id) == [refreshed["refresh_token"]]


def test_an_expired_session_says_to_sign_in_again_and_is_forgotten(
    auth: FakeSupabaseAuth, dev: DevServer, account: Account, admin: psycopg.Connection
) -> None:
    auth.access_ttl = 30
    assert login(account, auth, dev).returncode == 0
    auth.expire_sessions()

    chat = memchat(account, "chat", "--url", dev.url, stdin="never sent\n")
    assert chat.returncode == 1
    assert chat.stderr == (
        f"! your sign-in to {auth.url} has ended (Session Expired):"
        " sign in again with `memchat login`\n"
    )
    assert chat.stdout == ""
    assert not account.session_file.exists()
    assert stored_turns(admin, account.user_id) == []


def test_a_project_in_trouble_keeps_the_sign_in_for_a_retry(
    auth: FakeSupabaseAuth, dev: DevServer, dev_model: FakeOpenAI, account: Account
) -> None:
    auth.access_ttl = 30
    assert login(account, auth, dev).returncode == 0
    auth.failing = True
    chat = memchat(account, "chat", "--url", dev.url, stdin="hello\n")
    assert chat.returncode == 1
    assert chat.stderr == (
        f"! cannot refresh the sign-in at {auth.url}: Unexpected failure; try again\n"
    )
    assert account.session_file.exists()
    auth.failing = False
    again = memchat(account, "chat", "--url", dev.url, stdin="hello again\n")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "default> echo: hello again" in again.stdout


def test_an_email_code_signs_in_and_a_wrong_one_is_refused(
    auth: FakeSupabaseAuth, dev: DevServer, dev_model: FakeOpenAI, account: Account
) -> None:
    args = ["login", "--otp", "--api-url", dev.url, "--supabase-url", auth.url]
    args += ["--anon-key", ANON_KEY, "--email", account.email]
    for right in (False, True):
        proc = subprocess.Popen(
            [*MEMCHAT, *args],
            env=account.env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 60
        while account.email not in auth.codes and time.monotonic() < deadline:
            time.sleep(0.05)
        code = auth.codes[account.email]  # what the email would carry
        wrong = f"{(int(code) + 1) % 10**6:06d}"
        out, err = proc.communicate((code if right else wrong) + "\n", timeout=60)
        if right:
            assert proc.returncode == 0, err
            assert f"the code sent to {account.email}: signed in as {account.email}" in out
        else:
            assert proc.returncode == 1
            assert err == "! sign-in refused: Token has expired or is invalid\n"
            assert not account.session_file.exists()
            del auth.codes[account.email]
    assert account.stored()["user_id"] == str(account.user_id)
    assert auth.grants("password") == 0
    assert [p for _, p, _ in auth.requests] == ["/otp", "/verify", "/otp", "/verify"]


def test_logout_revokes_the_session_and_forgets_it(
    auth: FakeSupabaseAuth, dev: DevServer, account: Account
) -> None:
    assert login(account, auth, dev).returncode == 0
    assert len(auth.live_refresh_tokens(account.user_id)) == 1

    result = memchat(account, "logout")
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"signed out: {account.session_file} deleted\n"
    assert not account.session_file.exists()
    assert ("POST", "/logout", "") in auth.requests
    assert auth.live_refresh_tokens(account.user_id) == []  # revoked at the project
    assert memchat(account, "logout").stdout == "not signed in\n"


def test_import_sends_the_stored_sign_in_too(
    auth: FakeSupabaseAuth, dev: DevServer, account: Account, admin: psycopg.Connection
) -> None:
    assert login(account, auth, dev).returncode == 0
    document = account.config.parent / "history.json"
    message = {"role": "user", "content": "imported line", "created_at": "2026-01-02T03:04:05Z"}
    document.write_text(json.dumps({"sessions": [{"messages": [message]}]}))
    result = memchat(account, "import", str(document), "--url", dev.url, "--no-wait")
    assert result.returncode == 0, result.stdout + result.stderr
    assert stored_turns(admin, account.user_id) == ["imported line"]


def test_a_stored_sign_in_for_another_api_is_not_sent(
    auth: FakeSupabaseAuth, dev: DevServer, account: Account
) -> None:
    assert login(account, auth, dev).returncode == 0
    elsewhere = "https://api.example.test"
    chat = memchat(account, "chat", "--url", elsewhere, stdin="hello\n")
    assert chat.returncode == 1
    assert chat.stderr == (
        f"! no access token for {elsewhere} (you are signed in to {dev.url}): sign in with"
        f" `memchat login --api-url {elsewhere}`, or pass --token\n"
    )
    assert auth.grants("refresh_token") == 0


def test_the_cli_imports_supabase_only_for_a_sign_in() -> None:
    probe = (
        "import sys, memchat.cli; memchat.cli.build_parser();"
        " print(sorted(m for m in sys.modules if m.split('.')[0] in"
        " ('supabase', 'supabase_auth', 'postgrest', 'realtime', 'storage3')))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    )
    assert result.stdout == "[]\n"
