"""A deterministic local text embedder: feature hashing, no model, no download.

`local_embedding(text, dimensions)` is what the offline responder (`memchat
dev` with no OPENAI_API_KEY) and the tests' fake OpenAI server answer
`POST /embeddings` with, so recall can be tried and tested with no key,
no weights and no numpy.

What it is: a bag of words hashed into `dimensions` signed buckets (the
"hashing trick"). The text is NFKC-normalised and casefolded; words are runs
of Unicode letters and digits (apostrophes dropped, so "don't" is "dont");
a small English stop-word list is removed; a crude suffix strip makes
"colour"/"colours", "plan"/"planned"/"planning" and "like"/"likes"/"liked"
the same word. The features are those words (weight 1) and pairs of
neighbouring words (weight 1/2); runs of Han or kana characters, written
without spaces, count each character as a word. Each feature goes to
the bucket picked by a keyed BLAKE2b hash, with a sign picked by the
same hash (Python's `hash()` is salted per process; this one is stable
across processes, machines and versions). The vector is L2-normalised,
so cosine similarity is the dot product.

What that gives: texts that share content words score well above 0
("my favourite colour is teal" vs "what is my favourite colour?" is about
0.8 at 512 dimensions); texts that share none score about 0 (exactly 0 but
for hash collisions, which grow as `dimensions` shrinks). A text with no
content word at all (empty, punctuation, only stop words) gets one fixed
unit vector, the same for every such text: they all score 1.0 with each
other and about 0 with anything else.

What it is not: semantic. Synonyms ("car"/"automobile"), paraphrases,
other languages' inflections and typos are unrelated to it. It is a demo
and test aid; a real embedding model serves production. Changing the
features, weights or hash key changes every vector: vectors stored with one
version do not compare with another's (hence the "v1" in the key).
"""

from __future__ import annotations

import hashlib
import itertools
import math
import re
import unicodedata
from collections.abc import Iterator, Sequence

# Han (CJK unified ideographs, extension A, compatibility) and kana: scripts
# written without spaces between words.
_UNSPACED = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
# A run of unspaced-script characters, or a run of other letters and digits.
_TOKEN = re.compile(rf"[{_UNSPACED}]+|(?:(?![{_UNSPACED}])[^\W_])+")
_UNSPACED_RUN = re.compile(rf"[{_UNSPACED}]+")
_APOSTROPHES = re.compile("['\u2019\u02bc]")

# English function words: they say little about what a message is about.
_STOP_WORDS = frozenset(
    {
        "a", "about", "above", "after", "again", "against", "all", "am", "an", "and", "any", "are",
        "as", "at", "be", "because", "been", "before", "being", "below", "between", "both", "but",
        "by", "can", "could", "did", "do", "does", "doing", "done", "down", "during", "each",
        "few", "for", "from", "further", "had", "has", "have", "having", "he", "her", "here",
        "hers", "herself", "him", "himself", "his", "how", "i", "if", "in", "into", "is", "it",
        "its", "itself", "just", "me", "more", "most", "my", "myself", "no", "nor", "not", "now",
        "of", "off", "on", "once", "only", "or", "other", "our", "ours", "ourselves", "out",
        "over", "own", "same", "she", "should", "so", "some", "such", "than", "that", "the",
        "their", "theirs", "them", "themselves", "then", "there", "these", "they", "this", "those",
        "through", "to", "too", "under", "until", "up", "very", "was", "we", "were", "what",
        "when", "where", "which", "while", "who", "whom", "why", "will", "with", "would", "you",
        "your", "yours", "yourself", "yourselves", "im", "ive", "id", "ill", "youre", "youve",
        "youll", "youd", "hes", "shes", "weve", "theyre", "theyve", "dont", "doesnt", "didnt",
        "isnt", "arent", "wasnt", "werent", "cant", "couldnt", "wont", "wouldnt", "shouldnt",
        "also", "get", "got", "please", "tell", "let", "lets", "shall", "may", "might", "must",
        "us",
    }
)  # fmt: skip

# (suffix, replacement), first match wins; the stem keeps at least 3 characters.
_SUFFIXES = (
    ("sses", "ss"),
    ("ies", "y"),
    ("ingly", ""),
    ("edly", ""),
    ("ing", ""),
    ("ed", ""),
    ("ly", ""),
    ("s", ""),
)
_VOWELS = frozenset("aeiouy")

_UNIGRAM_WEIGHT = 1.0
_BIGRAM_WEIGHT = 0.5
_HASH_KEY = b"memchat-embed-v1"  # blake2b's `person` (<= 16 bytes): the version
_NO_CONTENT = "\x00no content words"  # the feature of a text that has none


def local_embedding(text: str, dimensions: int) -> list[float]:
    """`text` as a unit vector of `dimensions` floats (see the module docstring).

    Deterministic: the same text and dimensions give the same vector in every
    process. Any `str` is accepted (lone surrogates included).
    """
    if dimensions < 1:
        raise ValueError("dimensions must be at least 1")
    vector = [0.0] * dimensions
    for feature, weight in _features(text):
        bucket, sign = _bucket(feature, dimensions)
        vector[bucket] += sign * weight
    # None: no content word, or (with very few dimensions) features that
    # cancelled out in their buckets.
    return normalised(vector) or _fixed(dimensions)


def normalised(values: Sequence[float]) -> list[float] | None:
    """`values` scaled to L2 norm 1; None if that cannot be done (all zero, or
    not finite). Safe from overflow and underflow: `math.hypot` scales as it
    sums, and a norm too large for a float is taken after scaling the largest
    magnitude to 1. One C call for the usual vector (scaling first is
    many times slower)."""
    norm = math.hypot(*values)  # itself scaled: no overflow or underflow on the way
    if 0.0 < norm < math.inf:
        return [v / norm for v in values]  # each at most 1 in magnitude
    # 0 (all zero), NaN, or a norm beyond the largest float: scale first.
    largest = max((abs(v) for v in values), default=0.0)
    if largest == 0.0 or not math.isfinite(largest):
        return None
    scaled = [v / largest for v in values]
    norm = math.hypot(*scaled)  # between 1 and sqrt(len)
    if not math.isfinite(norm):  # a NaN among the values
        return None
    return [v / norm for v in scaled]


def _fixed(dimensions: int) -> list[float]:
    """The vector of a text without content words: one bucket, +1 or -1."""
    bucket, sign = _bucket(_NO_CONTENT, dimensions)
    vector = [0.0] * dimensions
    vector[bucket] = sign
    return vector


def _bucket(feature: str, dimensions: int) -> tuple[int, float]:
    digest = hashlib.blake2b(
        feature.encode("utf-8", "surrogatepass"), digest_size=8, person=_HASH_KEY
    ).digest()
    value = int.from_bytes(digest, "big")
    return (value >> 1) % dimensions, (1.0 if value & 1 else -1.0)


def _features(text: str) -> Iterator[tuple[str, float]]:
    """(feature, weight): each content word, and each pair of neighbours."""
    words = list(_words(text))
    for word in words:
        yield "w:" + word, _UNIGRAM_WEIGHT
    for first, second in itertools.pairwise(words):
        yield f"b:{first} {second}", _BIGRAM_WEIGHT


def _words(text: str) -> Iterator[str]:
    """The content words of `text`, normalised, in order."""
    text = _APOSTROPHES.sub("", unicodedata.normalize("NFKC", text).casefold())
    for token in _TOKEN.findall(text):
        if _UNSPACED_RUN.fullmatch(token):
            yield from token  # one word per character
        elif token not in _STOP_WORDS:
            yield _stem(token)


def _stem(word: str) -> str:
    """A crude English suffix strip: "colours" -> "colour", "planning" -> "plan",
    "likes"/"liked"/"like" -> "lik". Words with digits, and short words, are kept."""
    if len(word) <= 3 or not word.isalpha():
        return word
    for suffix, replacement in _SUFFIXES:
        if word.endswith(suffix):
            if suffix == "s" and word.endswith(("ss", "us", "is")):  # glass, campus, analysis
                break
            stem = word[: -len(suffix)] + replacement
            if len(stem) >= 3:
                word = stem
                break
    if len(word) > 3 and word.endswith("e"):  # like/liked, favourite/favourites
        word = word[:-1]
    if len(word) > 3 and word[-1] == word[-2] and word[-1] not in _VOWELS:  # plann -> plan
        word = word[:-1]
    return word
