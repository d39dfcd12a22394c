"""What model-written fact keys cost (MEMORY_RECALL_FACTS=model), per session.

With `model`, the embedding backfill asks the chat model for the facts a
session's new user messages state: up to FACTS_MESSAGES_PER_CALL
messages and FACTS_PROMPT_CHARS characters a request (facts_calls),
each request the prompt memchat.prompts.facts.facts_prompt builds. This script builds
those same requests for every session of a LongMemEval file (default: the
dev split, ../shared/eval/longmemeval_s_dev.json.gz from the project root),
as a backfill that reads each session whole would, and counts what they
cost: requests, the prompt's tokens with the model's tokenizer
(memchat.model.tokens, bpe-openai's vocabularies), and the most each may
write (facts_max_tokens; a real model writes a fraction of it:
its answers' length is the model's, so it is shown as a bound). No model is
called; the figures are the product's own prompts, counted.

    python tests/bench/bench_fact_cost.py
    python tests/bench/bench_fact_cost.py --model gpt-4o-mini --price-in 0.15 --price-out 0.60

A session's messages can straddle two of the backfill's embeddings requests
(EMBEDDING_BATCH_SIZE messages, which may span sessions); then its facts
take one request more than counted here.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: find `tests`

from memchat.prompts.facts import (
    facts_calls,
    facts_max_tokens,
    facts_prompt,
)
from tests.bench import _common as common
from tests.bench.bench_longmemeval import DEFAULT_DATA, load


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--model", default="gpt-4o-mini", help="whose tokenizer counts")
    parser.add_argument("--price-in", type=float, default=0.15, help="$ per million input tokens")
    parser.add_argument("--price-out", type=float, default=0.60, help="$ per million output tokens")
    args = parser.parse_args()

    common.ensure_import_path()
    from memchat.model.tokens import counter_for_model

    counter = counter_for_model(args.model)
    sessions: dict[str, list[str]] = {}
    for record in load(args.data):
        for session_id, turns in zip(
            record["haystack_session_ids"], record["haystack_sessions"], strict=True
        ):
            said = [t["content"] for t in turns if t["role"] == "user" and t["content"].strip()]
            if said:  # a session met in several questions' haystacks is counted once
                sessions.setdefault(session_id, said)

    requests: list[int] = []
    tokens_in: list[int] = []
    bound_out: list[int] = []
    for said in sessions.values():
        calls = facts_calls(said)
        requests.append(len(calls))
        prompts = [facts_prompt([said[i] for i in call]) for call in calls]
        tokens_in.append(sum(counter.count(m["content"]) + 4 for prompt in prompts for m in prompt))
        bound_out.append(sum(facts_max_tokens(len(call)) for call in calls))

    def row(name: str, values: list[int]) -> list[object]:
        return [
            name,
            f"{statistics.mean(values):.1f}",
            statistics.median(values),
            round(common.percentile(values, 95)),
            max(values),
            sum(values),
        ]

    print(f"data: {args.data} ({len(sessions)} distinct sessions with user messages)")
    print(f"tokenizer: {counter!r}; command: {common.command_line()}")
    print(
        common.format_table(
            ["per session", "mean", "median", "p95", "max", "total"],
            [
                row("user messages", [len(s) for s in sessions.values()]),
                row("facts requests", requests),
                row("prompt tokens", tokens_in),
                row("most it may write (tokens)", bound_out),
            ],
        )
    )
    cost_in = statistics.mean(tokens_in) * args.price_in / 1e6
    cost_out = statistics.mean(bound_out) * args.price_out / 1e6
    print(
        f"input per session: ${cost_in:.6f} at ${args.price_in}/M; output at most"
        f" ${cost_out:.6f} at ${args.price_out}/M; per 1,000 sessions:"
        f" ${1000 * cost_in:.3f} + at most ${1000 * cost_out:.3f}"
    )


if __name__ == "__main__":
    main()
