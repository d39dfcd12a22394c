"""Recall by meaning: the text a stored user message is embedded as (its
embedding and its fact keys' are the keys memchat.recall searches nearest
to the query's)."""

from __future__ import annotations

# What an embedding is made of at most: an embedding model reads only its
# text's start (OpenAI's 8,191 tokens, which this many characters stay within
# in any script; MiniLM 256, e5 512), and an imported message may be far
# longer (IMPORT_MAX_MESSAGE_CHARS) than a provider would take at all.
EMBEDDING_MAX_CHARS = 6000


def embedding_text(message: str) -> str:
    """The text embedded for a stored message (recall finds exchanges by it):
    the message's own text, its first EMBEDDING_MAX_CHARS characters. The
    one place that says so, for a turn's embedding (service.py) and the
    backfill's (usecases/backfill.py); which messages get one is SQL's
    memchat.embeddable (the user's and the assistant's, with text)."""
    return message[:EMBEDDING_MAX_CHARS]
