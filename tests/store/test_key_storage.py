"""How the recall keys and memories are stored."""

from __future__ import annotations

import psycopg


def test_vectors_and_lexemes_stay_in_the_row(admin: psycopg.Connection) -> None:
    """MAIN storage: a recall reads every key's vector and every round's
    lexemes; out of line (pgvector's default, which a type change restores)
    each would cost several more page reads (docs/benchmarks.md)."""
    rows = admin.execute(
        "select attrelid::regclass::text, attname, attstorage from pg_attribute"
        " where attrelid in ('memchat.message_embeddings'::regclass,"
        "                    'memchat.message_facts'::regclass, 'memchat.memories'::regclass)"
        "   and attname in ('embedding', 'lexemes') order by 1, 2"
    ).fetchall()
    assert rows == [
        ("memchat.memories", "embedding", "m"),
        ("memchat.memories", "lexemes", "x"),
        ("memchat.message_embeddings", "embedding", "m"),
        ("memchat.message_embeddings", "lexemes", "m"),
        ("memchat.message_facts", "embedding", "m"),
    ]
