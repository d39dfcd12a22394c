"""SQL written once: the fragments several of the store's statements share.

The database's own functions (the migrations) say the same in SQL; these
are the app's copies, each in one place.
"""

from __future__ import annotations

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
    """A vector as pgvector's text form; the SQL casts it (`%s::extensions.vector`)."""
    if vector is None:
        return None
    return "[" + ",".join(repr(float(x)) for x in vector) + "]"
