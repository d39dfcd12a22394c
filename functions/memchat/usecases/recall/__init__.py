"""Recall: the caller's earlier exchanges with an agent, found again.

One query (`store.RecallQuery`, built in `query.py`: the text, its
embedding, k, the period, the follow-up context, the settings that shape
them) goes to one SQL function, `memchat.recall`, which fuses the signals
by reciprocal rank. Each signal's Python side is a module named after it:

- meaning (`meaning.py`): the text a message is embedded as; the query's
  embedding is nearest to its keys;
- words (`query.py`: MEMORY_RECALL_WORDS): the rounds holding the text's words;
- time (`periods.py`, MEMORY_RECALL_TIME): the period a time expression names;
- facts (`facts.py`, MEMORY_RECALL_FACTS): the rule's extra keys of a
  message (the chat model's: memchat.prompts.facts);
- follow-ups (`follow_up.py`): a short message searched with the exchange before it;
- neighbours: the exchanges around a hit, read by `memchat.recall_hits` in SQL.

`service.py` runs it for a turn (embedding while the context loads) and for
GET /memory/search; `search.py` is the model's search_memory tool run for a turn.
Adding a signal touches its module, `query.py` and the SQL of memchat.recall.
"""

from memchat.usecases.recall.service import (
    DISABLED,
    FAILED,
    NOT_RECALLED,
    OK,
    PendingRecall,
    Recall,
    Recalled,
)

__all__ = ["DISABLED", "FAILED", "NOT_RECALLED", "OK", "PendingRecall", "Recall", "Recalled"]
