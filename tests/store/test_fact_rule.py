"""One rule in two languages: SQL's memchat.says_several_things (which
embedding rows wait for fact keys) agrees with Python's sentence split
(memchat.usecases.recall.facts.fact_sentences, which computes them)."""

from __future__ import annotations

import psycopg
import pytest

from memchat.usecases.recall.facts import _SENTENCE_END

SAMPLES = [
    "I like tea. My cat likes milk.",
    "I like tea.",
    "Really? Yes! (I think so.)",
    'He said "hi". "Then" what?',
    "I paid $3.50 for it. e.g. my cat",
    "first.second",
    "one.\n\nTwo lines",
    "ends with a dot. ",
    "",
    "Wait...  What?",
    "Mr. Smith came",
]


@pytest.mark.parametrize("text", SAMPLES)
def test_sql_and_python_agree_on_several_sentences(admin: psycopg.Connection, text: str) -> None:
    parts = [p for p in _SENTENCE_END.split(text) if p.strip()]
    (sql_says,) = admin.execute("select memchat.says_several_things(%s)", (text,)).fetchone()
    assert sql_says == (len(parts) >= 2)


def test_vectors_and_lexemes_stay_in_the_row(admin: psycopg.Connection) -> None:
    """MAIN storage: a recall reads every key's vector and every round's
    lexemes; out of line (pgvector's default, which a type change restores)
    each would cost several more page reads (docs/benchmarks.md)."""
    rows = admin.execute(
        "select attrelid::regclass::text, attname, attstorage from pg_attribute"
        " where attrelid in ('memchat.message_embeddings'::regclass,"
        "                    'memchat.message_facts'::regclass)"
        "   and attname in ('embedding', 'lexemes') order by 1, 2"
    ).fetchall()
    assert rows == [
        ("memchat.message_embeddings", "embedding", "m"),
        ("memchat.message_embeddings", "lexemes", "m"),
        ("memchat.message_facts", "embedding", "m"),
    ]
