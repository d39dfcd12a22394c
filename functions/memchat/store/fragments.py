"""SQL written once: the fragments several of the store's statements share.

The database's own functions (the migrations) say the same in SQL; these
are the app's copies, each in one place.
"""

from __future__ import annotations

import array
import struct
import sys

from psycopg.adapt import AdaptersMap, Dumper
from psycopg.pq import Format

# A session row as JSON (SessionInfo.from_json picks the fields it shows).
SESSION_JSON = "to_jsonb(s)"

# A final answer: an assistant message without tool calls (a tool-calling
# round is not an answer), of the message row `h`.
FINAL_ANSWER = """h.message->>'type' = 'ai'
   and coalesce(jsonb_array_length(h.message->'data'->'tool_calls'), 0) = 0"""

# A stored message's role as the API says it (LangChain's type: human is the
# user, ai the assistant), of the message row `h`; messages.ROLE_BY_TYPE is
# the same mapping in Python.
MESSAGE_ROLE = """case h.message->>'type' when 'human' then 'user' when 'ai' then 'assistant'
                 else h.message->>'type' end"""


def vector_literal(vector: list[float] | None) -> str | None:
    """A vector as pgvector's text form, for arrays of them (`%s::extensions.vector[]`,
    a batch); one vector is sent as a `Vector`."""
    if vector is None:
        return None
    return "[" + ",".join(repr(float(x)) for x in vector) + "]"


class Vector:
    """One vector as a query parameter, in pgvector's binary form (its length
    and a reserved field as int16, then the coordinates as big-endian float4):
    what the SQL casts (`%s::extensions.vector`) reads it as, with no text to
    format here or parse there (as text, both cost more than the rest of
    building the statement)."""

    __slots__ = ("data",)

    def __init__(self, vector: list[float]) -> None:
        floats = array.array("f", vector)
        if sys.byteorder == "little":
            floats.byteswap()
        self.data = struct.pack(">HH", len(floats), 0) + floats.tobytes()


def vector_param(vector: list[float] | None) -> Vector | None:
    """`vector` as a parameter (None: NULL)."""
    return None if vector is None else Vector(vector)


class _VectorDumper(Dumper):
    """Sends a `Vector` as it is, binary, with no type of its own (oid 0): the
    server takes its type from the cast beside the placeholder, so nobody
    needs pgvector's oid (an extension's, different in every database)."""

    format = Format.BINARY
    oid = 0

    def dump(self, obj: Vector) -> bytes:
        return obj.data


def register(adapters: AdaptersMap) -> None:
    """Let a connection's queries take `Vector`s (store.db does, for each)."""
    adapters.register_dumper(Vector, _VectorDumper)
