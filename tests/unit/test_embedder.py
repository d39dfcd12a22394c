"""The local embedder (memchat.model.embeddings): deterministic feature hashing.

It stands in for an embedding model offline and in tests, so what matters
is that it is stable across processes, returns unit vectors of the asked
size, and scores texts that share content words well above texts that
share none.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from memchat.model.embeddings import local_embedding, normalised


def cosine(a: str, b: str, dimensions: int = 512) -> float:
    # Unit vectors: the dot product is the cosine similarity.
    return sum(
        x * y
        for x, y in zip(local_embedding(a, dimensions), local_embedding(b, dimensions), strict=True)
    )


def norm(vector: list[float]) -> float:
    return math.sqrt(sum(v * v for v in vector))


TEXTS = [
    "my favourite colour is teal",
    "What is my favourite colour?",
    "",
    "the of and",
    "Ich wohne in München 🏠",
    "我喜欢喝绿茶",
    "caf\ud800 \x00 lone surrogate and NUL",
    "x" * 20_000,
]


def test_the_same_text_gives_the_same_vector_in_another_process() -> None:
    # Python's hash() is salted per process; the embedder must not depend on it.
    script = (
        "import json, sys\n"
        "from memchat.model.embeddings import local_embedding\n"
        "texts = json.loads(sys.stdin.read())\n"
        "print(json.dumps([local_embedding(t, 64) for t in texts]))\n"
    )
    texts = [t for t in TEXTS if "\ud800" not in t]  # JSON over a pipe needs valid UTF-8
    result = subprocess.run(
        [sys.executable, "-c", script],
        input=json.dumps(texts),
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "12345", "PATH": ""},
        timeout=60,
    )
    assert json.loads(result.stdout) == [local_embedding(t, 64) for t in texts]


@pytest.mark.parametrize("text", TEXTS, ids=range(len(TEXTS)))
@pytest.mark.parametrize("dimensions", [1, 7, 512, 1536])
def test_every_text_gives_a_finite_unit_vector_of_the_asked_size(
    text: str, dimensions: int
) -> None:
    vector = local_embedding(text, dimensions)
    assert len(vector) == dimensions
    assert all(isinstance(v, float) and math.isfinite(v) for v in vector)
    assert norm(vector) == pytest.approx(1.0)
    assert local_embedding(text, dimensions) == vector


def test_dimensions_must_be_positive() -> None:
    with pytest.raises(ValueError, match="dimensions"):
        local_embedding("hello", 0)


def test_texts_sharing_content_words_are_similar() -> None:
    assert cosine("my favourite colour is teal", "what is my favourite colour?") > 0.6
    # Inflections meet: colours/colour, planned/planning, likes/liked.
    assert cosine("I love these colours", "which colour do I love") > 0.5
    assert cosine("We planned a trip to Lisbon", "planning my Lisbon trip") > 0.5
    assert cosine("Ada likes green tea", "which tea is it that Ada liked?") > 0.4


def test_unrelated_texts_score_about_zero() -> None:
    pairs = [
        ("my favourite colour is teal", "the quarterly revenue report is due on Friday"),
        ("I am planning a trip to Lisbon", "how do I reset my router password"),
        ("Ada likes green tea", "Kubernetes pods keep restarting"),
    ]
    for a, b in pairs:
        assert abs(cosine(a, b)) < 0.15, (a, b)


def test_similar_beats_unrelated_for_a_query() -> None:
    query = "what is my favourite colour?"
    stored = [
        "my favourite colour is teal",
        "I was born in Porto",
        "remind me to buy milk",
    ]
    ranked = sorted(stored, key=lambda text: cosine(query, text), reverse=True)
    assert ranked[0] == "my favourite colour is teal"


def test_case_punctuation_and_stop_words_do_not_matter() -> None:
    assert local_embedding("Teal, my FAVOURITE colour!", 128) == local_embedding(
        "teal favourite colour", 128
    )


def test_word_order_matters_a_little() -> None:
    # Neighbouring pairs are features too: same words, other order, not identical.
    similarity = cosine("green tea before dinner", "dinner before green tea")
    assert 0.5 < similarity < 0.999


def test_texts_without_content_words_all_get_one_fixed_unit_vector() -> None:
    empty = local_embedding("", 256)
    assert sum(1 for v in empty if v) == 1 and norm(empty) == pytest.approx(1.0)
    for text in ["   ", "?!", "what is it?", "the of and", "I'm"]:
        assert local_embedding(text, 256) == empty, text
    # ... which is unrelated to content.
    assert abs(sum(x * y for x, y in zip(empty, local_embedding("teal", 256), strict=True))) < 0.5


def test_non_ascii_text() -> None:
    assert cosine("Ich wohne in München", "Wo wohne ich? In München.") > 0.5
    assert cosine("café crème", "CAFÉ CRÈME") == pytest.approx(1.0)
    # NFKC: the compatibility form of a character is the character.
    assert cosine("ﬁle", "file") == pytest.approx(1.0)
    # Han and kana are written without spaces: each character is a word.
    assert cosine("我喜欢喝绿茶", "我喜欢绿茶") > 0.5
    assert abs(cosine("我喜欢喝绿茶", "今天下雨")) < 0.2
    assert cosine("お茶が好きです", "好きなお茶") > 0.3


def test_normalised_scales_to_unit_length_without_overflow() -> None:
    assert normalised([3.0, 4.0]) == pytest.approx([0.6, 0.8])
    huge = normalised([1e308, 1e308])
    assert huge == pytest.approx([math.sqrt(0.5)] * 2)
    # Each value a float, their norm (3.4e308) beyond the largest one.
    assert normalised([1.7e308] * 4) == pytest.approx([0.5] * 4)
    half = math.sqrt(0.5)
    assert normalised([-1.7e308, 1.7e308, 0.0]) == pytest.approx([-half, half, 0.0])
    tiny = normalised([5e-324, 0.0])
    assert tiny == [1.0, 0.0]
    assert normalised([0.0, 0.0]) is None
    assert normalised([]) is None
    assert normalised([math.nan, 1.0]) is None
    assert normalised([1.0, math.nan]) is None
    assert normalised([math.inf, 1.0]) is None
