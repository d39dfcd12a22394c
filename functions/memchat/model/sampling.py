"""What a client may choose of how one answer is sampled.

POST /chat and POST /v1/chat/completions take these from the request and
every model call of the turn sends them (its tool rounds too); the rest of
the request body is memchat's own. `max_tokens` is capped at
OPENAI_MAX_TOKENS, so no request can spend more of the model budget than
the server allows. None (or no stop sequences): the provider's default.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

# OpenAI's bounds, which compatible servers share.
TEMPERATURE = (0.0, 2.0)
TOP_P = (0.0, 1.0)
PENALTY = (-2.0, 2.0)
MAX_STOP_SEQUENCES = 4
MAX_STOP_CHARS = 256
SEED = (-(2**63), 2**63 - 1)


@dataclass(frozen=True)
class Sampling:
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: tuple[str, ...] = ()
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None

    def request_fields(self, max_tokens: int) -> dict[str, Any]:
        """The chat request's fields for this sampling, the answer's length
        at most `max_tokens` (OPENAI_MAX_TOKENS)."""
        body: dict[str, Any] = {
            "max_tokens": min(self.max_tokens, max_tokens) if self.max_tokens else max_tokens
        }
        for field in fields(self):
            value = getattr(self, field.name)
            if field.name == "max_tokens" or value is None or value == ():
                continue
            body[field.name] = list(value) if field.name == "stop" else value
        return body


DEFAULT = Sampling()


def stop_sequences(value: object) -> tuple[str, ...]:
    """`stop` as the sequences it names: none for None or ""; a string; a list
    of at most MAX_STOP_SEQUENCES strings of 1 to MAX_STOP_CHARS characters
    (ValueError saying so for anything else)."""
    if value is None or value == "":
        return ()
    items = [value] if isinstance(value, str) else value
    if (
        not isinstance(items, list)
        or len(items) > MAX_STOP_SEQUENCES
        or not all(isinstance(i, str) and 1 <= len(i) <= MAX_STOP_CHARS for i in items)
    ):
        raise ValueError(
            f"a string or a list of at most {MAX_STOP_SEQUENCES} strings of 1 to"
            f" {MAX_STOP_CHARS} characters"
        )
    return tuple(items)
