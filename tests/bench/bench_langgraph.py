"""Benchmark: memchat's per-turn memory work with recall vs LangGraph's Postgres persistence.

Run on demand (pytest does not collect `bench_*.py`):

    .venv/bin/python tests/bench/bench_langgraph.py [--users 4] [--exchanges 1000]
        [--history 20] [--iterations 200] [--warmup 20] [--latency-ms 1] [--no-graph]
        [--vector-only] [--target 0.35] [--seed 1]

The target: memchat's recall overhead per turn stays <= 0.35x of
LangGraph's (thread history + PostgresStore search + put, same embedder).
The target is checked on memchat's whole memory work against LangGraph's;
the report also gives memchat's recall alone against LangGraph's whole
turn (the target's words read narrowly). One turn's memory work, timed end
to end on the client, per side:

- memchat: `store.load_context` (window 10), `store.recall` (k=3, window 10,
  min score 0.3, `query=store.Embedding(model, vector)`, `text=` the message:
  memchat.recall's hybrid ranking, vector and full text), then
  `store.record_turn` (the human + ai pair, storing the message's embedding):
  three calls, one round trip each, through
  `memchat.store.db.Database(url, max_connections=1)` as `memchat_user` under
  row-level security. No throttle token (LangGraph has no equivalent).
- langgraph: what an app on `langgraph-checkpoint-postgres` does for the same
  work, with its documented connection setup (`autocommit=True,
  prepare_threshold=0, row_factory=dict_row`; one connection for the
  checkpointer, one for the store):
  `AsyncPostgresSaver.aget_tuple` (the thread's latest checkpoint: the whole
  thread of --history messages, MessagesState-shaped; the app keeps the last
  10), `AsyncPostgresStore.asearch(("memories", user), query=message,
  limit=3)` (index: the same embedder, `fields=["question"]`, the store's
  default HNSW cosine index), `aput` of the exchange `{"question", "answer"}`
  (its question embedded), then `AsyncPostgresSaver.aput` of the new
  checkpoint (the thread + the turn's two messages, as the graph's
  `add_messages` reducer leaves it).
- langgraph (graph), for reference (--no-graph skips it): the same as a
  compiled `StateGraph(MessagesState)` with one node doing the search and the
  put through `runtime.store`, checkpointer and store attached:
  `graph.ainvoke({"messages": [HumanMessage]}, config, context=...)`, default
  durability. This is what a LangGraph app really runs (Pregel's loop, an
  input and a step checkpoint, the node's writes); the target is checked
  against the leaner direct calls above, LangGraph's lower bound.

The embedder is the same for both: a table of precomputed vectors (numpy,
clustered on topics like bench_recall's), looked up instantly by an async
function; memchat's side calls it once per turn (the app's `embed` before
recall), LangGraph's store calls it itself (the search's query and the put's
field: twice). Its time is measured and subtracted from both sides' totals
(a few microseconds), so the figures are the database and library work.

Data, the same on both sides: --users users (default 4), each with
--exchanges stored exchanges (question + answer, 10 and 20 made-up words:
4 and 6 of the exchange's topic, the rest common words, Zipf-distributed as
words of English text are, so the full-text half of memchat's recall
matches many of a user's rounds, as it would on real chats; the report
gives the share; 512-dimension vectors, or whatever memchat's column has),
inserted in one global order interleaving the users.
memchat: the exchanges in sessions of 25 turns, the newest --history / 2 of
them in the active session, every user message embedded (model recorded).
LangGraph: each exchange an item of the user's namespace (embedded by the
store itself, through `abatch`), and one thread per LangGraph variant
holding the active session's --history messages. Each turn's question is a
new message on the user's topics, answered by a fixed-length answer.

Sides are interleaved (order rotated every turn) over users; after every
turn what it added is deleted (untimed: memchat's two messages and their
embedding, LangGraph's item and new checkpoints and blobs) so the data keeps
its size. Both sides run on the embedded PostgreSQL that `_common.database()`
starts (pgserver; pgvector in schema `extensions`, where memchat's migrations
put it); LangGraph's tables are created by its own `setup()` in a schema
`langgraph` of the same database, its connections' search_path being
`langgraph, extensions` (its SQL names the vector type and operators
unqualified). With --latency-ms, each value adds a route through a
`common.LatencyProxy` (that much more per round trip), which also counts
each side's round trips.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import json
import math
import statistics
import struct
import sys
import uuid
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AsyncExitStack, ExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from time import perf_counter_ns
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np
import psycopg
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.base.id import uuid6
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.runtime import Runtime
from langgraph.store.base import PutOp
from langgraph.store.postgres.aio import AsyncPostgresStore
from psycopg import sql
from psycopg.conninfo import make_conninfo
from psycopg.rows import dict_row

from memchat import messages, store
from memchat.config import DUPLICATE_SCORE
from memchat.store.db import Database
from tests.bench import _common as common

AGENT = "default"
WINDOW = 10
K = 3
MIN_SCORE = 0.3  # MEMORY_RECALL_MIN_SCORE's default
MODEL = "bench-embedding"
TTL = timedelta(days=7)
TURNS_PER_SESSION = 25
SECONDS_BETWEEN_TURNS = 5
SCHEMA = "langgraph"  # LangGraph's tables, created by its setup()
NAMESPACE = "memories"
QUERIES = 50  # new questions per user, cycled
# What LangGraph's setup() creates (besides its migration tables).
LANGGRAPH_TABLES = (
    "store",
    "store_vectors",
    "checkpoints",
    "checkpoint_blobs",
    "checkpoint_writes",
)

# The text and vector model: topics shared across users (popular ones by
# many), each with its own words and a centre vector.
TOPICS = 200
TOPICS_PER_USER = 20
TOPIC_WORDS = 8
COMMON_WORDS = 5_000  # Zipf-distributed (exponent 1, as words in English text)
RANDOM_SHARE = 0.15  # stored messages with a random vector (off-topic)

MEMCHAT = "memchat"
LANGGRAPH = "langgraph"
GRAPH = "langgraph (graph)"


# ------------------------------------------------------------------ corpus


def unit_rows(matrix: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    return (matrix / np.maximum(norms, 1e-12)).astype(np.float32)


def pseudo_words(rng: np.random.Generator, n: int) -> list[str]:
    """`n` distinct made-up words of 2-3 syllables (stable under Postgres's stemmer)."""
    syllables = [c + v for c in "bdfgklmnprtvz" for v in "aeiou"]
    words: dict[str, None] = {}
    while len(words) < n:
        picked = rng.choice(len(syllables), int(rng.integers(2, 4)))
        words["".join(syllables[i] for i in picked)] = None
    return list(words)


class Corpus:
    """Questions, answers and their vectors, deterministic for a seed."""

    def __init__(self, seed: int, dims: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.dims = dims
        words = pseudo_words(self.rng, COMMON_WORDS + TOPICS * TOPIC_WORDS)
        self.common = words[:COMMON_WORDS]
        zipf = 1.0 / (np.arange(COMMON_WORDS) + 1.0)
        self.common_p = zipf / zipf.sum()
        self.topic_words = [
            words[COMMON_WORDS + t * TOPIC_WORDS : COMMON_WORDS + (t + 1) * TOPIC_WORDS]
            for t in range(TOPICS)
        ]
        self.centres = unit_rows(self.rng.standard_normal((TOPICS, dims), dtype=np.float32))
        popularity = 1.0 / (np.arange(TOPICS) + 10.0)
        self.popularity = popularity / popularity.sum()
        weights = 1.0 / (np.arange(TOPICS_PER_USER) + 1.0)
        self.topic_weights = weights / weights.sum()

    def user_topics(self) -> np.ndarray:
        return self.rng.choice(TOPICS, TOPICS_PER_USER, replace=False, p=self.popularity)

    def sentence(self, topic: int, n_topic: int, n_common: int, end: str) -> str:
        picked = list(self.rng.choice(self.topic_words[topic], n_topic))
        picked += list(self.rng.choice(self.common, n_common, p=self.common_p))
        self.rng.shuffle(picked)
        text = " ".join(str(w) for w in picked)
        return text[0].upper() + text[1:] + end

    def exchanges(
        self, topics: np.ndarray, n: int, random_share: float
    ) -> tuple[list[tuple[str, str]], np.ndarray]:
        """`n` (question, answer) pairs on the user's topics and the questions' vectors."""
        picked = self.rng.choice(topics, n, p=self.topic_weights)
        pairs = [
            (self.sentence(int(t), 4, 6, "?"), self.sentence(int(t), 6, 14, ".")) for t in picked
        ]
        spread = self.rng.uniform(0.8, 1.3, (n, 1)).astype(np.float32) / math.sqrt(self.dims)
        noise = self.rng.standard_normal((n, self.dims), dtype=np.float32)
        vectors = unit_rows(self.centres[picked] + spread * noise)
        off_topic = np.flatnonzero(self.rng.random(n) < random_share)
        vectors[off_topic] = unit_rows(
            self.rng.standard_normal((len(off_topic), self.dims), dtype=np.float32)
        )
        return pairs, vectors


class Embedder:
    """The embedder both sides use: precomputed vectors, looked up by text.

    Async (as an HTTP embedder's client is), so LangGraph's store awaits it
    directly; counts its own time to subtract it from the turns'."""

    def __init__(self) -> None:
        self.table: dict[str, list[float]] = {}
        self.ns = 0
        self.calls = 0

    def add(self, texts: Sequence[str], vectors: np.ndarray) -> None:
        for text, vector in zip(texts, vectors, strict=True):
            self.table[text] = [float(x) for x in vector]

    async def embed(self, texts: list[str]) -> list[list[float]]:
        t0 = perf_counter_ns()
        out = [self.table[t] for t in texts]
        self.ns += perf_counter_ns() - t0
        self.calls += 1
        return out


VECTOR_HEADER = struct.Struct(">HH")


def vector_bytes(rows: np.ndarray) -> list[bytes]:
    """pgvector's binary form (vector_recv) of each row: dim, 0, big-endian float4s."""
    header = VECTOR_HEADER.pack(rows.shape[1], 0)
    return [header + row.tobytes() for row in rows.astype(">f4")]


# -------------------------------------------------------------------- data


@dataclass
class Thread:
    """A LangGraph thread as filled: its id and what to keep when resetting it."""

    thread_id: str
    checkpoint_id: str
    version: str  # the messages channel's version in the filled checkpoint


@dataclass
class User:
    caller: store.Caller
    session_id: uuid.UUID  # memchat's active session
    last_id: int  # its highest filled chat_message_history.id
    message_count: int
    turn_count: int
    namespace: tuple[str, str]
    history: list[BaseMessage]  # the active session's messages, LangGraph's thread
    queries: list[tuple[str, str]]  # the turns' (question, answer), cycled
    threads: dict[str, Thread] = field(default_factory=dict)  # per LangGraph variant


def fill_memchat(
    admin: psycopg.Connection[Any],
    users: list[User],
    order: list[tuple[int, int]],
    pairs: list[list[tuple[str, str]]],
    vectors: list[np.ndarray],
    history: int,
) -> None:
    """Sessions, messages and embeddings for every user, in the global `order`."""
    total = len(order)
    now = datetime.now(UTC)
    active_turns = history // 2
    session_of: list[list[uuid.UUID]] = []
    for u, user in enumerate(users):
        n = len(pairs[u])
        older = n - active_turns
        ids = [uuid.uuid4() for _ in range(math.ceil(older / TURNS_PER_SESSION))]
        session_of.append(
            [ids[j // TURNS_PER_SESSION] if j < older else user.session_id for j in range(n)]
        )
    sequence = "pg_get_serial_sequence('public.chat_message_history', 'id')"
    with admin.transaction():
        row = admin.execute(f"select nextval({sequence})").fetchone()
        assert row is not None
        base = int(row[0])
        admin.execute(f"select setval({sequence}, %s)", (base + 2 * total,))
        sessions: dict[uuid.UUID, list[Any]] = {}  # id -> [user, first, last, turns]
        rows = []
        for i, (u, j) in enumerate(order):
            at = now - timedelta(seconds=SECONDS_BETWEEN_TURNS * (total - i))
            sid = session_of[u][j]
            entry = sessions.setdefault(sid, [users[u].caller.user_id, at, at, 0])
            entry[2] = at
            entry[3] += 1
            question, answer = pairs[u][j]
            rows.append((base + 2 * i, sid, users[u].caller.user_id, messages.human(question), at))
            rows.append(
                (
                    base + 2 * i + 1,
                    sid,
                    users[u].caller.user_id,
                    messages.ai(answer),
                    at + timedelta(seconds=1),
                )
            )
        with admin.cursor() as cur:
            with cur.copy(
                "copy public.chat_sessions (id, user_id, agent_name, title, message_count,"
                " turn_count, created_at, last_active_at, expires_at) from stdin"
            ) as copy:
                for sid, (uid, first, last, turns) in sessions.items():
                    copy.write_row(
                        (sid, uid, AGENT, "benchmark", 2 * turns, turns, first, last,
                         now + timedelta(days=1))
                    )  # fmt: skip
            with cur.copy(
                "copy public.chat_message_history (id, session_id, user_id, message, created_at)"
                " from stdin"
            ) as copy:
                for message_row in rows:
                    msg = message_row[3]
                    copy.write_row((*message_row[:3], json.dumps(msg), message_row[4]))
        for user in users:
            admin.execute(
                "insert into public.user_agent_active_sessions"
                " (user_id, agent_name, active_session_id) values (%s, %s, %s)",
                (user.caller.user_id, AGENT, user.session_id),
            )
    # The user messages' embeddings (the trigger adds their rounds' lexemes).
    columns = "message_id, user_id, session_id, agent_name, created_at, embedding, model"
    with (
        admin.cursor() as cur,
        cur.copy(f"copy memchat.message_embeddings ({columns}) from stdin (format binary)") as copy,
    ):
        copy.set_types(["int8", "uuid", "uuid", "text", "timestamptz", "bytea", "text"])
        for i, (u, j) in enumerate(order):
            human_row = rows[2 * i]
            data = vector_bytes(vectors[u][j : j + 1])[0]
            copy.write_row(
                (human_row[0], human_row[2], human_row[1], AGENT, human_row[4], data, MODEL)
            )
    # As the backfill leaves them: their fact keys made (these say one thing
    # each, so there are none).
    admin.execute("update memchat.message_embeddings set facts_model = model")
    for user in users:
        row = admin.execute(
            "select max(h.id), s.message_count, s.turn_count from public.chat_message_history h"
            " join public.chat_sessions s on s.id = h.session_id"
            " where h.session_id = %s group by s.message_count, s.turn_count",
            (user.session_id,),
        ).fetchone()
        assert row is not None and row[1] == history
        user.last_id, user.message_count, user.turn_count = int(row[0]), row[1], row[2]
    row = admin.execute(
        "select count(*) filter (where model = %s and lexemes is not null and facts_model = %s),"
        " count(*) from memchat.message_embeddings",
        (MODEL, MODEL),
    ).fetchone()
    assert row is not None and row[0] == row[1] == total, row


async def fill_langgraph(
    lg_store: AsyncPostgresStore,
    users: list[User],
    order: list[tuple[int, int]],
    pairs: list[list[tuple[str, str]]],
    chunk: int = 500,
) -> None:
    """Every exchange an item of its user's namespace, in the same global order."""
    ops = [
        PutOp(
            users[u].namespace,
            str(uuid.uuid4()),
            {"question": pairs[u][j][0], "answer": pairs[u][j][1]},
        )
        for u, j in order
    ]
    for start in range(0, len(ops), chunk):
        await lg_store.abatch(ops[start : start + chunk])


async def fill_thread(saver: AsyncPostgresSaver, history: list[BaseMessage]) -> Thread:
    """A thread whose latest checkpoint holds `history` in MessagesState's channel."""
    thread_id = str(uuid.uuid4())
    checkpoint = empty_checkpoint()
    version = saver.get_next_version(None, None)
    checkpoint["channel_values"] = {"messages": list(history)}
    checkpoint["channel_versions"] = {"messages": version}
    config = await saver.aput(
        {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}},
        checkpoint,
        {"source": "update", "step": 0, "parents": {}},
        {"messages": version},
    )
    return Thread(thread_id, str(config["configurable"]["checkpoint_id"]), version)


# ------------------------------------------------------------------ routes


@dataclass
class TurnContext:
    """What the graph's node gets besides the state (LangGraph's runtime context)."""

    namespace: tuple[str, ...]
    key: str
    answer: str
    hits: list[int]  # the node reports its hit count here


async def chat_node(state: MessagesState, runtime: Runtime[TurnContext]) -> dict[str, Any]:
    """A chat node's memory work: the window, the store's search, the put."""
    ctx = runtime.context
    assert runtime.store is not None
    window = state["messages"][:-1][-WINDOW:]
    message = str(state["messages"][-1].content)
    hits = await runtime.store.asearch(ctx.namespace, query=message, limit=K)
    await runtime.store.aput(ctx.namespace, ctx.key, {"question": message, "answer": ctx.answer})
    ctx.hits.append(len(hits))
    assert len(window) == min(WINDOW, len(state["messages"]) - 1)
    return {"messages": [AIMessage(ctx.answer)]}


@dataclass
class Samples:
    """One side's samples on one route, in ms, embedder time subtracted."""

    total: list[float] = field(default_factory=list)
    parts: dict[str, list[float]] = field(default_factory=dict)
    embed: list[float] = field(default_factory=list)
    hits: list[int] = field(default_factory=list)
    trips: list[int] = field(default_factory=list)


@dataclass
class Route:
    label: str
    proxy: common.LatencyProxy | None
    db: Database
    saver: AsyncPostgresSaver
    lg_store: AsyncPostgresStore
    graph: Any
    samples: dict[str, Samples]
    rtt: list[common.Stats] = field(default_factory=list)

    def count(self) -> int:
        return self.proxy.round_trips if self.proxy else 0


def langgraph_conninfo(url: str) -> str:
    return make_conninfo(url, options=f"-c search_path={SCHEMA},extensions")


async def langgraph_connection(url: str) -> psycopg.AsyncConnection[Any]:
    """LangGraph's documented connection setup (from_conn_string's)."""
    return await psycopg.AsyncConnection.connect(
        langgraph_conninfo(url), autocommit=True, prepare_threshold=0, row_factory=dict_row
    )


async def open_route(
    stack: AsyncExitStack,
    label: str,
    url: str,
    proxy: common.LatencyProxy | None,
    embedder: Embedder,
    dims: int,
    sides: list[str],
) -> Route:
    saver_conn = await langgraph_connection(url)
    stack.push_async_callback(saver_conn.close)
    store_conn = await langgraph_connection(url)
    stack.push_async_callback(store_conn.close)
    saver = AsyncPostgresSaver(saver_conn)
    lg_store = AsyncPostgresStore(
        store_conn, index={"dims": dims, "embed": embedder.embed, "fields": ["question"]}
    )
    graph = (
        StateGraph(MessagesState, context_schema=TurnContext)
        .add_node("chat", chat_node)
        .add_edge(START, "chat")
        .add_edge("chat", END)
        .compile(checkpointer=saver, store=lg_store)
    )
    db = Database(url, max_connections=1)
    stack.push_async_callback(db.close)
    return Route(label, proxy, db, saver, lg_store, graph, {s: Samples() for s in sides})


# ------------------------------------------------------------------- turns

# (part name, end time) marks of a turn, after its start.
Marks = list[tuple[str, int]]


async def memchat_turn(
    r: Route, user: User, question: str, answer: str, embedder: Embedder, text: bool
) -> tuple[Marks, int]:
    marks: Marks = []
    vector = (await embedder.embed([question]))[0]
    marks.append(("embed", perf_counter_ns()))
    ctx = await store.load_context(
        r.db, user.caller, session_id=user.session_id, agent_name=AGENT, window=WINDOW
    )
    marks.append(("load_context", perf_counter_ns()))
    query = store.Embedding(MODEL, vector)
    hits = await store.recall(
        r.db,
        user.caller,
        store.RecallQuery(
            session_id=user.session_id,
            agent_name=AGENT,
            window=WINDOW,
            embedding=query,
            k=K,
            min_score=MIN_SCORE,
            text=question if text else None,
            duplicate_score=DUPLICATE_SCORE,
        ),
    )
    marks.append(("recall", perf_counter_ns()))
    await store.record_turn(
        r.db,
        user.caller,
        store.Turn(
            session_id=user.session_id,
            agent_name=AGENT,
            messages=[messages.human(question), messages.ai(answer)],
            title=None,
            ttl=TTL,
            embedding=query,
        ),
    )
    marks.append(("record_turn", perf_counter_ns()))
    assert ctx.session is not None and len(ctx.messages) == WINDOW
    return marks, len(hits)


async def langgraph_turn(
    r: Route, user: User, question: str, answer: str, key: str
) -> tuple[Marks, int]:
    marks: Marks = []
    thread = user.threads[LANGGRAPH]
    config: Any = {"configurable": {"thread_id": thread.thread_id, "checkpoint_ns": ""}}
    latest = await r.saver.aget_tuple(config)
    assert latest is not None
    thread_messages = latest.checkpoint["channel_values"]["messages"]
    window = thread_messages[-WINDOW:]
    marks.append(("checkpoint get", perf_counter_ns()))
    hits = await r.lg_store.asearch(user.namespace, query=question, limit=K)
    marks.append(("store search", perf_counter_ns()))
    await r.lg_store.aput(user.namespace, key, {"question": question, "answer": answer})
    marks.append(("store put", perf_counter_ns()))
    # The checkpoint the graph's add_messages leaves: the thread + the turn.
    checkpoint = latest.checkpoint.copy()
    checkpoint["id"] = str(uuid6(clock_seq=1))
    checkpoint["ts"] = datetime.now(UTC).isoformat()
    version = r.saver.get_next_version(checkpoint["channel_versions"]["messages"], None)
    checkpoint["channel_values"] = {
        **checkpoint["channel_values"],
        "messages": [
            *thread_messages,
            HumanMessage(question, id=str(uuid.uuid4())),
            AIMessage(answer, id=str(uuid.uuid4())),
        ],
    }
    checkpoint["channel_versions"] = {**checkpoint["channel_versions"], "messages": version}
    await r.saver.aput(
        latest.config,
        checkpoint,
        {"source": "loop", "step": 1, "parents": {}},
        {"messages": version},
    )
    marks.append(("checkpoint put", perf_counter_ns()))
    assert len(window) == WINDOW
    return marks, len(hits)


async def graph_turn(
    r: Route, user: User, question: str, answer: str, key: str, history: int
) -> tuple[Marks, int]:
    thread = user.threads[GRAPH]
    hits: list[int] = []
    state = await r.graph.ainvoke(
        {"messages": [HumanMessage(question)]},
        {"configurable": {"thread_id": thread.thread_id}},
        context=TurnContext(user.namespace, key, answer, hits),
    )
    end = perf_counter_ns()
    assert len(state["messages"]) == history + 2 and len(hits) == 1
    return [("ainvoke", end)], hits[0]


def reset(admin: psycopg.Connection[Any], side: str, user: User, key: str | None) -> None:
    """Delete what a turn added (untimed), so the data keeps its size."""
    if side == MEMCHAT:
        with admin.transaction():
            admin.execute(
                "delete from public.chat_message_history where session_id = %s and id > %s",
                (user.session_id, user.last_id),
            )
            admin.execute(
                "update public.chat_sessions set message_count = %s, turn_count = %s where id = %s",
                (user.message_count, user.turn_count, user.session_id),
            )
        return
    thread = user.threads[side]
    schema = sql.Identifier(SCHEMA)
    with admin.transaction():
        admin.execute(
            sql.SQL("delete from {}.store where prefix = %s and key = %s").format(schema),
            (".".join(user.namespace), key),
        )
        admin.execute(
            sql.SQL(
                "delete from {}.checkpoints where thread_id = %s and checkpoint_id <> %s"
            ).format(schema),
            (thread.thread_id, thread.checkpoint_id),
        )
        admin.execute(
            sql.SQL(
                "delete from {}.checkpoint_blobs where thread_id = %s"
                " and not (channel = 'messages' and version = %s)"
            ).format(schema),
            (thread.thread_id, thread.version),
        )
        admin.execute(
            sql.SQL("delete from {}.checkpoint_writes where thread_id = %s").format(schema),
            (thread.thread_id,),
        )


async def run_turn(
    side: str,
    r: Route,
    user: User,
    question: str,
    answer: str,
    embedder: Embedder,
    args: argparse.Namespace,
) -> tuple[int, Marks, int, int, int, str | None]:
    """One turn of `side`: (start, marks, hits, embedder ns, round trips, store key)."""
    key = None if side == MEMCHAT else str(uuid.uuid4())
    turn: Callable[[], Awaitable[tuple[Marks, int]]]
    if side == MEMCHAT:
        turn = lambda: memchat_turn(  # noqa: E731
            r, user, question, answer, embedder, not args.vector_only
        )
    elif side == LANGGRAPH:
        turn = lambda: langgraph_turn(r, user, question, answer, str(key))  # noqa: E731
    else:
        turn = lambda: graph_turn(r, user, question, answer, str(key), args.history)  # noqa: E731
    embed_before = embedder.ns
    c0 = r.count()
    t0 = perf_counter_ns()
    marks, hits = await turn()
    return t0, marks, hits, embedder.ns - embed_before, r.count() - c0, key


def record(samples: Samples, t0: int, marks: Marks, hits: int, embed_ns: int, trips: int) -> None:
    samples.total.append((marks[-1][1] - t0 - embed_ns) / 1e6)
    samples.embed.append(embed_ns / 1e6)
    samples.hits.append(hits)
    samples.trips.append(trips)
    start = t0
    for name, end in marks:
        samples.parts.setdefault(name, []).append((end - start) / 1e6)
        start = end


# ------------------------------------------------------------------ report


def fmt(value: float) -> str:
    return f"{value:.3f}"


def versions(admin: psycopg.Connection[Any]) -> str:
    names = [
        "langgraph",
        "langgraph-checkpoint",
        "langgraph-checkpoint-postgres",
        "langchain-core",
        "psycopg-pool",
    ]
    found = []
    for name in names:
        try:
            found.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            found.append(f"{name} (not installed)")
    row = admin.execute("select extversion from pg_extension where extname = 'vector'").fetchone()
    found.append(f"pgvector {row[0] if row else '?'}")
    return ", ".join(found)


def report(
    admin: psycopg.Connection[Any],
    target: common.Target,
    args: argparse.Namespace,
    routes: list[Route],
    sides: list[str],
    dims: int,
    load_at_start: str,
    matched: float,
) -> None:
    print("# memchat's per-turn memory work with recall vs LangGraph's Postgres persistence")
    print()
    print(common.machine_report(admin, target, load_at_start=load_at_start))
    print(f"packages:   {versions(admin)}")
    print(
        f"data:       {args.users} users x {args.exchanges:,} stored exchanges, {dims}-dim"
        f" vectors (model {MODEL!r}); active session / thread of {args.history} messages,"
        f" window {WINDOW}, k={K}, memchat min score {MIN_SCORE}"
    )
    if args.vector_only:
        print("recall:     memchat's by vector only (--vector-only: text=None, no full-text list)")
    else:
        print(
            f"recall:     memchat's hybrid (text= the message): a turn's message has words in"
            f" {matched:.0%} of the user's stored rounds (median over its questions)"
        )
    print(
        f"iterations: {args.iterations} per user per side per route"
        f" (after {args.warmup} warm-up), {args.users * args.iterations} timed turns per side"
        " per route; sides interleaved, order rotated each turn"
    )
    print()
    if len(routes) > 1 or routes[0].proxy:
        print("Routes (select 1 round trip, median ms, measured before / after the run):")
        print()
        print(
            common.format_table(
                ["route", "select 1 ms", "path"],
                [
                    [
                        r.label,
                        " / ".join(fmt(st.median) for st in r.rtt),
                        r.proxy.description if r.proxy else target.description,
                    ]
                    for r in routes
                ],
            )
        )
        print()
    rows = []
    for r in routes:
        for side in sides:
            s = r.samples[side]
            total = common.summarize(s.total)
            trips = str(statistics.median_low(s.trips)) if r.proxy and s.trips else "-"
            rows.append(
                [
                    r.label,
                    side,
                    fmt(total.median),
                    fmt(total.p95),
                    fmt(total.mean),
                    f"{statistics.median(s.embed) * 1000:.1f}",
                    f"{statistics.fmean(s.hits):.2f}",
                    trips,
                ]
            )
    print(
        common.format_table(
            [
                "route",
                "side",
                "median ms",
                "p95 ms",
                "mean ms",
                "embedder us (excluded)",
                "hits per turn",
                "round trips",
            ],
            rows,
        )
    )
    print()
    print(
        "Breakdown (median ms, embedder time not subtracted: LangGraph embeds inside search / put):"
    )
    print()
    breakdown = []
    for r in routes:
        for side in sides:
            parts = r.samples[side].parts
            breakdown.append(
                [
                    r.label,
                    side,
                    ", ".join(f"{name} {fmt(statistics.median(v))}" for name, v in parts.items()),
                ]
            )
    print(common.format_table(["route", "side", "parts"], breakdown))
    print()
    for r in routes:
        m = common.summarize(r.samples[MEMCHAT].total)
        lines = []
        for other in sides[1:]:
            o = common.summarize(r.samples[other].total)
            lines.append(
                f"memchat / {other}: median {m.median / o.median:.2f}, p95 {m.p95 / o.p95:.2f}"
            )
        lg = common.summarize(r.samples[LANGGRAPH].total)
        ratio = m.median / lg.median
        verdict = "met" if ratio <= args.target else "MISSED"
        print(f"{r.label}: " + "; ".join(lines))
        print(
            f"{r.label}: target memchat / langgraph median <= {args.target:.2f}:"
            f" {ratio:.2f} ({verdict})"
        )
        # The words read narrowly: what recall itself adds to memchat's
        # turn (the rest a memory backend does without recall too).
        recall = statistics.median(r.samples[MEMCHAT].parts["recall"])
        print(
            f"{r.label}: memchat's recall alone / langgraph's whole turn, median:"
            f" {recall / lg.median:.2f}"
        )


# --------------------------------------------------------------------- run


def prepare_users(
    admin: psycopg.Connection[Any], corpus: Corpus, embedder: Embedder, args: argparse.Namespace
) -> tuple[list[User], list[tuple[int, int]], list[list[tuple[str, str]]], list[np.ndarray]]:
    users, pairs, vectors = [], [], []
    for _ in range(args.users):
        topics = corpus.user_topics()
        stored, stored_vectors = corpus.exchanges(topics, args.exchanges, RANDOM_SHARE)
        new, new_vectors = corpus.exchanges(topics, QUERIES, 0.0)
        embedder.add([q for q, _ in stored], stored_vectors)
        embedder.add([q for q, _ in new], new_vectors)
        caller = common.create_user(admin)
        active = stored[len(stored) - args.history // 2 :]
        history: list[BaseMessage] = []
        for question, answer in active:
            history += [
                HumanMessage(question, id=str(uuid.uuid4())),
                AIMessage(answer, id=str(uuid.uuid4())),
            ]
        users.append(
            User(
                caller=caller,
                session_id=uuid.uuid4(),
                last_id=0,
                message_count=0,
                turn_count=0,
                namespace=(NAMESPACE, str(caller.user_id)),
                history=history,
                queries=new,
            )
        )
        pairs.append(stored)
        vectors.append(stored_vectors)
    # One global order, the users' exchanges interleaved (each user's in its order).
    owners = np.repeat(np.arange(args.users), args.exchanges)
    corpus.rng.shuffle(owners)
    seen = [0] * args.users
    order = []
    for u in owners:
        order.append((int(u), seen[u]))
        seen[u] += 1
    return users, order, pairs, vectors


async def run(args: argparse.Namespace) -> int:
    load_at_start = common.load_average()
    sides = [MEMCHAT, LANGGRAPH] + ([] if args.no_graph else [GRAPH])
    with common.database() as target, ExitStack() as stack:
        admin = common.admin_connection(target.url)
        admin.execute(sql.SQL("create schema if not exists {}").format(sql.Identifier(SCHEMA)))
        users: list[User] = []
        try:
            dims = store.embedding_dimensions(admin, role=None)
            corpus = Corpus(seed=args.seed, dims=dims)
            embedder = Embedder()
            users, order, pairs, vectors = prepare_users(admin, corpus, embedder, args)
            fill_memchat(admin, users, order, pairs, vectors, args.history)

            async with AsyncExitStack() as astack:
                routes = [
                    await open_route(astack, "direct", target.url, None, embedder, dims, sides)
                ]
                await routes[0].saver.setup()
                await routes[0].lg_store.setup()
                await fill_langgraph(routes[0].lg_store, users, order, pairs)
                for user in users:
                    for side in sides[1:]:
                        user.threads[side] = await fill_thread(routes[0].saver, user.history)
                common.vacuum_analyze(
                    admin,
                    "public.chat_message_history",
                    "public.chat_sessions",
                    "public.user_agent_active_sessions",
                    "memchat.message_embeddings",
                    "auth.users",
                    *(f"{SCHEMA}.{t}" for t in LANGGRAPH_TABLES),
                )
                urls = [target.url]
                for ms in args.latency_ms:
                    proxy = stack.enter_context(common.LatencyProxy(target.url, ms))
                    urls.append(proxy.url)
                    routes.append(
                        await open_route(
                            astack, f"+{ms:g} ms", proxy.url, proxy, embedder, dims, sides
                        )
                    )
                for r, url in zip(routes, urls, strict=True):
                    r.rtt.append(common.round_trip_ms(url, 200))

                for i in range(args.warmup + args.iterations):
                    timed = i >= args.warmup
                    for j, r in enumerate(routes):
                        for k, user in enumerate(users):
                            question, answer = user.queries[i % len(user.queries)]
                            shift = (i + j + k) % len(sides)
                            for side in sides[shift:] + sides[:shift]:
                                t0, marks, hits, embed_ns, trips, key = await run_turn(
                                    side, r, user, question, answer, embedder, args
                                )
                                if timed:
                                    record(r.samples[side], t0, marks, hits, embed_ns, trips)
                                reset(admin, side, user, key)

                for r, url in zip(routes, urls, strict=True):
                    r.rtt.append(common.round_trip_ms(url, 200))
                matched = full_text_share(admin, users)
                report(admin, target, args, routes, sides, dims, load_at_start, matched)
                check_sizes(admin, users, args, sides)
        finally:
            # Leave a DATABASE_URL database as found (users cascade to their rows).
            admin.execute(
                sql.SQL("drop schema if exists {} cascade").format(sql.Identifier(SCHEMA))
            )
            admin.execute(
                "delete from auth.users where id = any(%s)",
                ([u.caller.user_id for u in users],),
            )
            admin.close()
    return 0


def full_text_share(admin: psycopg.Connection[Any], users: list[User]) -> float:
    """The median share of a user's embedded rounds holding a word of a turn's
    message (memchat.any_words: what recall's full-text list ranks)."""
    shares = []
    for user in users:
        for question, _ in user.queries:
            row = admin.execute(
                "select avg((lexemes @@ memchat.any_words(%s))::int)"
                " from memchat.message_embeddings where user_id = %s",
                (question, user.caller.user_id),
            ).fetchone()
            assert row is not None
            shares.append(float(row[0]))
    return statistics.median(shares)


def check_sizes(
    admin: psycopg.Connection[Any], users: list[User], args: argparse.Namespace, sides: list[str]
) -> None:
    """The data kept its size: every turn's additions were deleted."""
    grown = []
    for user in users:
        row = admin.execute(
            sql.SQL(
                "select (select count(*) from public.chat_message_history where user_id = %s),"
                " (select count(*) from memchat.message_embeddings where user_id = %s),"
                " (select count(*) from {}.store where prefix = %s)"
            ).format(sql.Identifier(SCHEMA)),
            (user.caller.user_id, user.caller.user_id, ".".join(user.namespace)),
        ).fetchone()
        assert row is not None
        if tuple(row) != (2 * args.exchanges, args.exchanges, args.exchanges):
            grown.append(f"{user.caller.user_id}: {tuple(row)}")
        for side in sides[1:]:
            n = admin.execute(
                sql.SQL("select count(*) from {}.checkpoints where thread_id = %s").format(
                    sql.Identifier(SCHEMA)
                ),
                (user.threads[side].thread_id,),
            ).fetchone()
            if n is None or n[0] != 1:
                grown.append(f"{side} thread of {user.caller.user_id}: {n} checkpoints")
    print()
    if grown:
        print("data grew during the run: " + "; ".join(grown))
    else:
        print("data sizes unchanged after the run (each turn's additions deleted untimed)")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", type=int, default=4, help="users, measured in turn (4)")
    parser.add_argument(
        "--exchanges", type=int, default=1_000, help="stored exchanges per user (1000)"
    )
    parser.add_argument(
        "--history",
        type=int,
        default=20,
        help="messages in the active session / LangGraph thread (20; even, >= 10)",
    )
    parser.add_argument(
        "--iterations", type=int, default=200, help="timed turns per user per side (200)"
    )
    parser.add_argument("--warmup", type=int, default=20, help="untimed turns first (20)")
    parser.add_argument(
        "--latency-ms",
        type=common.comma_list(float),
        action="extend",
        default=[],
        metavar="MS[,MS...]",
        help="also run every side through a local TCP proxy adding MS of round-trip time,"
        " once per value (counts round trips too)",
    )
    parser.add_argument(
        "--no-graph", action="store_true", help="skip the compiled StateGraph reference side"
    )
    parser.add_argument(
        "--target", type=float, default=0.35, help="the ratio to meet (0.35, issue 22)"
    )
    parser.add_argument(
        "--vector-only",
        action="store_true",
        help="memchat's recall without text= (vector list only): the full-text part's share",
    )
    parser.add_argument("--seed", type=int, default=1, help="the data's random seed (1)")
    args = parser.parse_args(argv)
    if args.history < WINDOW or args.history % 2:
        parser.error(f"--history must be even and >= {WINDOW}")
    if args.exchanges < args.history // 2 + TURNS_PER_SESSION:
        parser.error("--exchanges too small for --history")
    if any(ms < 0 for ms in args.latency_ms):
        parser.error("--latency-ms values must be >= 0")
    return args


def main(argv: list[str] | None = None) -> int:
    return asyncio.run(run(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
