"""Secrets read at run time: DATABASE_URL, OPENAI_API_KEY, EMBEDDING_API_KEY,
SUPABASE_JWT_SECRET.

A deployed function is given only where each secret lives, never its value:
`<NAME>_SECRET_ARN` (AWS Secrets Manager) or `<NAME>_PARAMETER` (an SSM
Parameter Store SecureString name). The value is fetched once per cold start
through Powertools Parameters and handed to `Settings` directly, so it never
sits in the process environment. Where neither is set, the plain `<NAME>`
variable is used as it is (local development, tests). boto3 and Powertools
Parameters are imported only when something has to be fetched.

A secret's value is either the plain string, or a JSON object with the
variable's name as a key (what the Secrets Manager console's key/value
editor writes), e.g. `{"DATABASE_URL": "postgresql://..."}`.

Each function reads only the secrets it uses: `load_settings` fetches those
its ROUTE_GROUPS need (`config.secret_settings`: no OPENAI_API_KEY or
EMBEDDING_API_KEY unless it serves chat or runs the summary worker), and
template.yaml grants each function's role exactly those.
The cleanup function reads its own DATABASE_URL (the memchat_cleanup role's)
and nothing else.

Example:
    from memchat import secrets

    settings = secrets.load_settings()  # fetched secrets + the environment
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, get_args

from memchat.config import ConfigError, Job, parse_route_groups, secret_settings
from memchat.config import load_settings as _load_settings

if TYPE_CHECKING:
    from memchat.config import Settings

# Settings fields whose values may live in a secret store.
SECRET_SETTINGS = ("database_url", "openai_api_key", "embedding_api_key", "supabase_jwt_secret")

Fetch = Callable[[str], str | bytes | dict[str, Any]]


def _fetch_secret(arn: str) -> str | bytes | dict[str, Any]:
    from aws_lambda_powertools.utilities import parameters

    return parameters.get_secret(arn)


def _fetch_parameter(name: str) -> str | bytes | dict[str, Any]:
    from aws_lambda_powertools.utilities import parameters

    return parameters.get_parameter(name, decrypt=True)


def _value_of(raw: str | bytes | dict[str, Any], variable: str, where: str) -> str:
    text = raw.decode() if isinstance(raw, bytes) else raw
    if isinstance(text, str) and text.lstrip().startswith("{"):
        # Not JSON after all: a plain value that happens to start with "{".
        with contextlib.suppress(ValueError):
            text = json.loads(text)
    if isinstance(text, dict):
        for key in (variable, variable.lower()):
            if isinstance(text.get(key), str):
                return str(text[key]).strip()
        raise ConfigError(f"invalid configuration: {where} has no key {variable!r}")
    value = str(text).strip()
    if not value:
        raise ConfigError(f"invalid configuration: {where} is empty")
    return value


def resolve(
    names: Iterable[str] = SECRET_SETTINGS,
    environ: Mapping[str, str] | None = None,
    *,
    fetch_secret: Fetch | None = None,
    fetch_parameter: Fetch | None = None,
) -> dict[str, str]:
    """The values of the named settings that are kept in a secret store.

    Returns only those with `<NAME>_SECRET_ARN` or `<NAME>_PARAMETER` set;
    the others are left to the environment. Failures raise ConfigError naming
    the variable and where it pointed (never a value).
    """
    env = os.environ if environ is None else environ
    values: dict[str, str] = {}
    for name in names:
        variable = name.upper()
        arn = env.get(f"{variable}_SECRET_ARN", "").strip()
        parameter = env.get(f"{variable}_PARAMETER", "").strip()
        if arn and parameter:
            raise ConfigError(
                f"invalid configuration: set {variable}_SECRET_ARN or "
                f"{variable}_PARAMETER, not both"
            )
        if arn:
            fetch, source, where = (
                fetch_secret or _fetch_secret,
                arn,
                f"{variable}_SECRET_ARN ({arn})",
            )
        elif parameter:
            fetch, source, where = (
                fetch_parameter or _fetch_parameter,
                parameter,
                f"{variable}_PARAMETER ({parameter})",
            )
        else:
            continue
        try:
            raw = fetch(source)
        except ConfigError:
            raise
        except Exception as exc:
            # boto3 missing, access denied, not found, throttled: say which one failed.
            raise ConfigError(
                f"invalid configuration: could not read {where}: {type(exc).__name__}: {exc}"
            ) from None
        values[name] = _value_of(raw, variable, where)
    return values


def load_settings(**overrides: object) -> Settings:
    """Settings from the environment, with secret-store values filled in.

    Only the secrets this process needs are fetched (`job`: a scheduled job's;
    else its ROUTE_GROUPS': the model keys only where chat is served), whatever
    else the environment points at.
    """
    job = next((j for j in get_args(Job) if j == overrides.get("job")), None)
    groups = overrides.get("route_groups", os.environ.get("ROUTE_GROUPS"))
    try:
        names = secret_settings(parse_route_groups(None if job else groups), job)
    except ValueError as exc:
        raise ConfigError(f"invalid configuration: ROUTE_GROUPS: {exc}") from None
    return _load_settings(**{**resolve(names), **overrides})
