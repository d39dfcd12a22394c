"""The local embeddings, run as a person runs them (subprocesses): `memchat
embeddings serve` answering the real `openai` client, `memchat db reembed
--embeddings local` embedding what is stored (and refusing a column of
another size without --dimensions), and `memchat dev --embeddings local`
recalling with all-MiniLM-L6-v2.

Each test that changes the embedding column's size has a database of its own
on the test server (the shared one keeps vector(512) for every other test).
"""

from __future__ import annotations

import math
import re
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import psycopg
import pytest

from memchat import store
from memchat.auth import Caller
from memchat.model import minilm
from memchat.store.db import Database
from memchat.usecases.recall.meaning import embedding_text
from tests.utils.analytics_data import Fresh, fresh_database
from tests.utils.dev_server import MEMCHAT, clean_env
from tests.utils.processes import free_port, wait_healthy
from tests.utils.store_data import exchange, record
from tests.utils.users import UserFactory

MODEL = minilm.NAME  # all-MiniLM-L6-v2
DIMS = minilm.DIMENSIONS  # 384
TIMEOUT = 120
FACT = "my favourite colour is teal"
QUESTION = "what is my favourite colour?"
UNRELATED = "we fly to Lisbon in May"
PARAPHRASE = "which hue do I like best?"  # FACT's meaning, none of its words
# MiniLM scores these 0.287 and 0.142 against PARAPHRASE: above its floor
# (minilm.RECALL_MIN_SCORE, 0.2) and below it; both under the default 0.3.
NEARBY = "My car is a blue hatchback"
FAR = "I water the garden every Sunday morning"


# ------------------------------------------------------------------ helpers


def env_for(home: Path, **values: str) -> dict[str, str]:
    """A clean environment (no model, Supabase, database or embedding settings)."""
    env = {k: v for k, v in clean_env().items() if not k.startswith("EMBEDDING_")}
    env.update(MEMCHAT_HOME=str(home), **values)
    return env


def memchat(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*MEMCHAT, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT
    )


def wait_for_models(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    """Poll GET {url}/models until the server answers (or fail with its output)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"exited ({proc.returncode}):\n{log.read_text()}")
        try:
            if httpx.get(f"{url}/models", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"no answer on {url}/models:\n{log.read_text()}")


def embedded(conn: psycopg.Connection, user_id: uuid.UUID) -> dict[str, tuple[str | None, int]]:
    """The user's embedded messages: text -> (model, vector size)."""
    rows = conn.execute(
        "select h.message->'data'->>'content', e.model, extensions.vector_dims(e.embedding)"
        " from memchat.message_embeddings e"
        " join public.chat_message_history h on h.id = e.message_id and h.user_id = e.user_id"
        " where e.user_id = %s",
        (user_id,),
    ).fetchall()
    return {r[0]: (r[1], r[2]) for r in rows}


def value(conn: psycopg.Connection, query: str, params: tuple[Any, ...] = ()) -> Any:
    """The one value a query returns."""
    row = conn.execute(query, params).fetchone()
    assert row is not None
    return row[0]


def stored_vector(conn: psycopg.Connection, text: str) -> list[float]:
    literal = value(
        conn,
        "select e.embedding::text from memchat.message_embeddings e"
        " join public.chat_message_history h on h.id = e.message_id and h.user_id = e.user_id"
        " where h.message->'data'->>'content' = %s",
        (text,),
    )
    return [float(x) for x in literal.strip("[]").split(",")]


def column_size(conn: psycopg.Connection) -> int:
    return int(value(conn, "select memchat.embedding_dimensions()"))


def store_old_embedding(
    conn: psycopg.Connection, user_id: uuid.UUID, session_id: uuid.UUID
) -> None:
    """A vector(512) embedding of another model for the session's first
    message, as a turn stored it before the local model was used."""
    conn.execute(
        "insert into memchat.message_embeddings"
        " (message_id, user_id, session_id, agent_name, created_at, model, embedding)"
        " select min(id), %s, %s, 'default', now(), 'text-embedding-3-small',"
        " %s::extensions.vector from public.chat_message_history where session_id = %s",
        (user_id, session_id, "[" + ",".join(["0.0442"] * 512) + "]", session_id),
    )


@pytest.fixture(scope="module")
def model() -> minilm.MiniLM:
    """The model in this process, to compare what the commands stored or served."""
    return minilm.load()


@pytest.fixture
def own_database(
    admin: psycopg.Connection, admin_url: str, role_password: str | None
) -> Iterator[Fresh]:
    """A migrated database of this test's own: its column may change size."""
    with fresh_database(admin, admin_url, role_password) as database:
        yield database


async def with_an_old_embedding(database: Fresh) -> tuple[psycopg.Connection[Any], Caller]:
    """A user with one exchange whose message has a vector(512) embedding of
    text-embedding-3-small, as stored before the column changed size."""
    owner = database.admin
    alice = UserFactory(owner).create()
    api = Database(database.api_url)
    try:
        session = await record(api, alice, exchange(FACT, "noted"))
    finally:
        await api.close()
    store_old_embedding(owner, alice.user_id, session.id)
    return owner, alice


@pytest.fixture
def running() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes to kill after the test if they still run."""
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


# ------------------------------------------------------- embeddings serve


def test_embeddings_serve_answers_the_openai_client_with_unit_vectors(
    tmp_path: Path, running: list[subprocess.Popen[bytes]], model: minilm.MiniLM
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1"
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*MEMCHAT, "embeddings", "serve", "--port", str(port)],
            env=env_for(tmp_path / "home"),
            cwd=tmp_path,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    running.append(proc)
    wait_for_models(url, proc, log)
    assert f"embeddings: {MODEL} ({DIMS} dimensions) at {url}" in log.read_text()

    client = openai.OpenAI(base_url=url, api_key="local", max_retries=0, timeout=30)
    texts = [FACT, QUESTION, UNRELATED]
    # The SDK's default encoding (base64 when it asks for one), then plain floats.
    default = client.embeddings.create(model=MODEL, input=texts)
    floats = client.embeddings.create(
        model=MODEL, input=texts, encoding_format="float", dimensions=DIMS
    )
    assert default.model == MODEL
    assert [d.index for d in default.data] == [0, 1, 2]
    expected = model.embed(texts)
    for answer in (default, floats):
        vectors = [d.embedding for d in answer.data]
        assert [len(v) for v in vectors] == [DIMS] * 3
        assert all(math.isclose(math.fsum(x * x for x in v), 1.0, abs_tol=1e-5) for v in vectors)
        for vector, want in zip(vectors, expected, strict=True):
            assert vector == pytest.approx(want.tolist(), abs=1e-6)
    assert default.usage.prompt_tokens > 0

    def cosine(a: int, b: int) -> float:
        pairs = zip(floats.data[a].embedding, floats.data[b].embedding, strict=True)
        return sum(x * y for x, y in pairs)

    assert cosine(0, 1) > cosine(0, 2) + 0.2  # meaning, not shared words
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]

    # Another model's name (memchat records it with each vector), another size: refused.
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="text-embedding-3-small", input=FACT)
    with pytest.raises(openai.BadRequestError, match="dimensions"):
        client.embeddings.create(model=MODEL, input=FACT, dimensions=512)
    # An input longer than all the tokenizer is shown: 413, naming it.
    with pytest.raises(openai.APIStatusError, match=r"input\[1\] is 262145 characters") as big:
        client.embeddings.create(model=MODEL, input=[FACT, "x" * (minilm.MAX_CHARS + 1)])
    assert big.value.status_code == 413

    proc.send_signal(signal.SIGINT)  # Ctrl-C
    assert proc.wait(timeout=30) == 0
    assert "memchat embeddings serve: stopping" in log.read_text()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{url}/models", timeout=2)


def test_embeddings_serve_on_a_taken_port_says_so(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = env_for(tmp_path / "home")
        done = memchat(env, tmp_path, "embeddings", "serve", "--port", str(port))
    assert done.returncode == 1, done.stderr
    assert f"memchat embeddings serve: cannot listen on 127.0.0.1:{port}" in done.stderr


# ------------------------------------------------------------ db reembed


async def test_reembed_local_embeds_what_lacks_an_embedding_once(
    own_database: Fresh, tmp_path: Path, model: minilm.MiniLM
) -> None:
    owner = own_database.admin
    alice = UserFactory(owner).create()
    api = Database(own_database.api_url)
    try:
        first = await record(api, alice, exchange(FACT, "noted"))
        await record(api, alice, exchange(UNRELATED, "have fun") + exchange(QUESTION, "teal"))
    finally:
        await api.close()
    store_old_embedding(owner, alice.user_id, first.id)
    env = env_for(tmp_path / "home", DATABASE_URL=own_database.admin_url)

    refused = memchat(env, tmp_path, "db", "reembed", "--embeddings", "local")
    assert refused.returncode == 2, refused.stderr
    assert (
        f"reembed: the database stores vector(512) embeddings but EMBEDDING_DIMENSIONS is"
        f" {DIMS}: pass --dimensions {DIMS} to change the column"
    ) in refused.stderr
    assert column_size(owner) == 512  # nothing changed
    assert embedded(owner, alice.user_id) == {FACT: ("text-embedding-3-small", 512)}

    done = memchat(env, tmp_path, "db", "reembed", "--embeddings", "local", "--dimensions", "384")
    assert done.returncode == 0, done.stderr
    assert f"the column is now vector({DIMS}); 1 vector(512) embeddings deleted" in done.stderr
    # Every message with text, the answers too (3 each), with the local model.
    assert f"reembed: 6 messages in 2 sessions to embed with {MODEL}" in done.stderr
    assert re.search(r"reembed: 6 embedded in \d+\.\d s; 0 left", done.stderr), done.stderr
    assert column_size(owner) == DIMS
    every_message = {
        text: (MODEL, DIMS) for text in (FACT, "noted", UNRELATED, "have fun", QUESTION, "teal")
    }
    assert embedded(owner, alice.user_id) == every_message
    for text in (FACT, QUESTION):
        want = model.embed([embedding_text(text)])[0].tolist()
        assert stored_vector(owner, text) == pytest.approx(want, abs=1e-5)
    assert value(owner, "select count(*) from memchat.embedding_queue") == 0
    assert store.count_unembedded(owner, MODEL) == 0

    again = memchat(env, tmp_path, "db", "reembed", "--embeddings", "local")
    assert again.returncode == 0, again.stderr
    assert f"reembed: 0 messages in 0 sessions to embed with {MODEL}" in again.stderr
    assert re.search(r"reembed: 0 embedded in \d+\.\d s; 0 left", again.stderr), again.stderr

    # Embeddings stored before models were recorded, adopted instead of embedded again.
    owner.execute("update memchat.message_embeddings set model = null")
    adopted = memchat(env, tmp_path, "db", "reembed", "--embeddings", "local", "--adopt-unknown")
    assert adopted.returncode == 0, adopted.stderr
    assert f"reembed: 6 embeddings of an unknown model marked as {MODEL}'s" in adopted.stderr
    assert f"reembed: 0 messages in 0 sessions to embed with {MODEL}" in adopted.stderr
    assert embedded(owner, alice.user_id) == every_message

    # Messages stored before durable memory: --memories makes theirs, embedded.
    kept = value(owner, "select count(*) from memchat.memories where embedding is not null")
    assert kept > 0
    owner.execute("delete from memchat.memories")
    remade = memchat(env, tmp_path, "db", "reembed", "--embeddings", "local", "--memories")
    assert remade.returncode == 0, remade.stderr
    assert f"reembed: {kept} memories made of stored messages and summaries" in remade.stderr
    # Each is its whole message here: it takes the message's embedding.
    assert "; 0 left (0 memories embedded)" in remade.stderr, remade.stderr
    assert value(owner, "select count(*) from memchat.memories where embedding is not null") == kept


async def test_resizing_the_column_takes_the_fact_key_marks_of_what_it_deletes(
    own_database: Fresh,
) -> None:
    owner, alice = await with_an_old_embedding(own_database)
    # Its fact keys marked made with that embedding (supabase/schemas/functions/embeddings.sql).
    marked = owner.execute(
        "insert into memchat.message_facts_made (message_id, user_id, model)"
        " select e.message_id, e.user_id, e.model from memchat.message_embeddings e"
        " where e.user_id = %s",
        (alice.user_id,),
    )
    assert marked.rowcount == 1
    assert store.resize_embeddings(owner, DIMS) == 1
    # Its embedding is gone (another size), and so is the mark.
    assert value(owner, "select count(*) from memchat.message_facts_made") == 0


async def test_reembed_refuses_to_run_with_no_embeddings_provider(
    own_database: Fresh, tmp_path: Path
) -> None:
    """No OPENAI_API_KEY, no EMBEDDING_API_KEY or EMBEDDING_BASE_URL, not
    --embeddings local: it would embed with `memchat dev`'s offline stand-in,
    vectors no real model made. Exit code 2 naming the ways out; nothing
    queued or embedded."""
    owner = own_database.admin
    alice = UserFactory(owner).create()
    api = Database(own_database.api_url)
    try:
        await record(api, alice, exchange(FACT, "noted"))
    finally:
        await api.close()
    env = env_for(tmp_path / "home", DATABASE_URL=own_database.admin_url)

    refused = memchat(env, tmp_path, "db", "reembed")
    assert refused.returncode == 2, refused.stderr
    assert (
        "reembed: no embeddings provider is configured: set OPENAI_API_KEY (or"
        " EMBEDDING_API_KEY and/or EMBEDDING_BASE_URL for another provider), or pass"
        " --embeddings local to embed with all-MiniLM-L6-v2 on this machine"
    ) in refused.stderr
    assert "messages in" not in refused.stderr  # it never got to counting them
    assert value(owner, "select count(*) from memchat.embedding_queue") == 0
    assert embedded(owner, alice.user_id) == {}

    # A provider of its own (here one nobody answers at: the column's size is
    # checked first) is enough: past that check, to the next.
    elsewhere = {**env, "EMBEDDING_BASE_URL": "http://127.0.0.1:9/v1", "EMBEDDING_DIMENSIONS": "8"}
    other = memchat(elsewhere, tmp_path, "db", "reembed")
    assert other.returncode == 2, other.stderr
    assert "no embeddings provider" not in other.stderr
    assert "EMBEDDING_DIMENSIONS is 8: pass --dimensions 8" in other.stderr


def test_reembed_refuses_dimensions_the_settings_do_not_have(
    own_database: Fresh, tmp_path: Path
) -> None:
    """EMBEDDING_DIMENSIONS=384 against the vector(512) column, no --dimensions:
    exit code 2, naming both sizes and the two ways out; nothing changed."""
    env = env_for(
        tmp_path / "home",
        DATABASE_URL=own_database.admin_url,
        EMBEDDING_DIMENSIONS="384",
        OPENAI_API_KEY="test-key",  # a provider (never called: the size is refused first)
    )
    refused = memchat(env, tmp_path, "db", "reembed")
    assert refused.returncode == 2, refused.stderr
    assert (
        "reembed: the database stores vector(512) embeddings but EMBEDDING_DIMENSIONS is 384:"
        " pass --dimensions 384 to change the column (its vector(512) embeddings are deleted),"
        " or set EMBEDDING_DIMENSIONS=512"
    ) in refused.stderr
    assert column_size(own_database.admin) == 512


# ------------------------------------------------------ dev --embeddings local


def start_dev(
    env: dict[str, str], cwd: Path, running: list[subprocess.Popen[bytes]]
) -> tuple[str, Path]:
    port = free_port()
    log = cwd / f"memchat-dev-{port}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*MEMCHAT, "dev", "--port", str(port), "--summary-every", "0", "--embeddings", "local"],
            env=env,
            cwd=cwd,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    running.append(proc)
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url, proc, lambda: log.read_text(errors="replace"), "memchat dev")
    return url, log


def test_dev_with_local_embeddings_recalls_with_minilm(
    own_database: Fresh,
    tmp_path: Path,
    running: list[subprocess.Popen[bytes]],
    model: minilm.MiniLM,
) -> None:
    env = env_for(
        tmp_path / "home",
        DATABASE_URL=own_database.admin_url,
        SUPABASE_JWT_SECRET="embeddings-cli-test-secret-" + "e" * 32,
        CHAT_RATE_PER_MINUTE="0",
        EMBEDDING_TIMEOUT_SECONDS="20",  # a busy test machine: recall must not give up
    )
    url, log = start_dev(env, tmp_path, running)
    (proc,) = running
    output = log.read_text()
    assert f"embeddings: the empty embedding column is now vector({DIMS})" in output
    line = re.search(
        r"model:      the offline responder \(OPENAI_API_KEY is not set\); embeddings: "
        + re.escape(MODEL)
        + rf" at (http://127\.0\.0\.1:\d+/v1) \({DIMS} dimensions\)",
        output,
    )
    assert line, output
    assert "recall:     MEMORY_RECALL_MIN_SCORE=0.2, all-MiniLM-L6-v2's floor" in output
    embeddings_url = line.group(1)
    assert httpx.get(f"{embeddings_url}/models", timeout=5).json()["data"][0]["id"] == MODEL
    assert column_size(own_database.admin) == DIMS

    token = re.search(r"#token=(\S+)", output)
    assert token, output
    auth = {"Authorization": f"Bearer {token.group(1)}"}
    first = httpx.post(f"{url}/chat", json={"message": FACT}, headers=auth, timeout=60)
    assert first.status_code == 200, first.text
    assert first.json()["memory"]["recall_status"] == "ok"

    def turn(text: str) -> dict[str, Any]:
        said = httpx.post(
            f"{url}/chat",
            json={"message": text, "session_id": str(uuid.uuid4())},
            headers=auth,
            timeout=60,
        )
        assert said.status_code == 200, said.text
        body: dict[str, Any] = said.json()
        return body

    nearby = {text: turn(text)["user_message_id"] for text in (NEARBY, FAR)}
    # A new conversation finds it by meaning: the two share no word. The
    # car's colour, above MiniLM's floor, comes after; the garden does not.
    memory: dict[str, Any] = turn(PARAPHRASE)["memory"]
    assert memory["recall_status"] == "ok"
    assert [hit["message_id"] for hit in memory["recalled"]] == [
        first.json()["user_message_id"],
        nearby[NEARBY],
    ]
    user_id = _user_of(own_database, first.json())
    assert embedded(own_database.admin, user_id) == {
        text: (MODEL, DIMS) for text in (FACT, NEARBY, FAR, PARAPHRASE)
    }
    want = model.embed([FACT])[0].tolist()
    assert stored_vector(own_database.admin, FACT) == pytest.approx(want, abs=1e-5)

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0, log.read_text()
    with pytest.raises(httpx.ConnectError):  # its embeddings server went with it
        httpx.get(f"{embeddings_url}/models", timeout=2)


def _user_of(database: Fresh, turn: dict[str, Any]) -> uuid.UUID:
    query = "select user_id from public.chat_sessions where id = %s"
    return uuid.UUID(str(value(database.admin, query, (turn["session_id"],))))


async def test_dev_with_local_embeddings_refuses_a_column_holding_another_size(
    own_database: Fresh, tmp_path: Path
) -> None:
    owner, _ = await with_an_old_embedding(own_database)
    env = env_for(
        tmp_path / "home",
        DATABASE_URL=own_database.admin_url,
        SUPABASE_JWT_SECRET="embeddings-cli-test-secret-" + "e" * 32,
    )
    done = memchat(
        env, tmp_path, "dev", "--port", str(free_port()), "--summary-every", "0",
        "--embeddings", "local",
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert (
        f"memchat dev --embeddings local: the database stores vector(512) embeddings and"
        f" {MODEL} makes {DIMS} dimensions. Run `memchat db reembed --dimensions {DIMS}"
        " --embeddings local`"
    ) in done.stderr
    assert column_size(owner) == 512  # left alone
    assert "API on" not in done.stderr
