"""`memchat token`: a dev access token for a local user (created if missing)."""

from __future__ import annotations

import os
import uuid
from typing import TYPE_CHECKING

from memchat.cli.base import database_url, jwt_secret

if TYPE_CHECKING:
    import argparse

    from memchat.cli.base import Subcommands

DEFAULT_EMAIL = "dev@example.test"


def default_email(user_id: uuid.UUID | None) -> str:
    """The dev user's email, or one of the given user's own (never another's)."""
    return f"{user_id}@example.test" if user_id else DEFAULT_EMAIL


def ensure_user(url: str, user_id: uuid.UUID | None, email: str) -> uuid.UUID:
    """The local user with this id or email, created if missing (never on Supabase)."""
    from memchat.store.db import connect
    from memchat.store.users import LocalUserError, ensure_local_user

    with connect(url) as conn:
        try:
            return ensure_local_user(conn, user_id, email)
        except LocalUserError as exc:
            raise SystemExit(str(exc)) from None


def mint_local_token(user_id: uuid.UUID | None, email: str | None, ttl_seconds: int) -> str:
    """A token for the local user (created if missing), signed with the JWT secret."""
    from memchat import devtokens

    url = database_url()
    email = email or default_email(user_id)
    resolved = ensure_user(url, user_id, email)
    issuer = os.environ.get("SUPABASE_URL")
    return devtokens.mint(
        jwt_secret(),
        resolved,
        email=email,
        ttl_seconds=ttl_seconds,
        issuer=f"{issuer.rstrip('/')}/auth/v1" if issuer else None,
    )


def cmd_token(args: argparse.Namespace) -> int:
    token = mint_local_token(args.user_id, args.email, args.ttl)
    print(token)
    return 0


def register(commands: Subcommands) -> None:
    tok = commands.add_parser("token", help="print a dev access token (creates the user locally)")
    tok.add_argument("--user-id", type=uuid.UUID, default=None)
    tok.add_argument(
        "--email", default=None, help=f"default {DEFAULT_EMAIL}, or <user-id>@example.test"
    )
    tok.add_argument("--ttl", type=int, default=3600, help="seconds (default 3600)")
    tok.set_defaults(func=cmd_token)
