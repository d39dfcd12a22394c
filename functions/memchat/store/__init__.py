"""The store: every SQL statement memchat runs, in one place, one module per resource.

One calling convention: a store function takes first the handle it runs on,
then, when it acts for a user, that user (`Caller`):

- `db: Database` (store.db) for requests and the summary worker: each call is
  one transaction (mostly one round trip), as `memchat_user` with the
  caller's claims (row-level security decides what each statement sees), or
  as the connecting role for the worker's own functions;
- `conn: psycopg.Connection` for the batch jobs that hold one connection for
  a whole run (the cleanup, migrations, `memchat token`, `memchat stats`).

The records they take and return are in store.records. Modules: turns (a
chat turn's two round trips), embeddings (recall), notes, sessions, export,
account, feedback, stats, summaries (the worker's queue), cleanup,
analytics, migrations, users (local dev users), db (connections and the
per-request transaction), fragments (SQL written once).

Callers use the package (`store.load_context(...)`); the names below are
its whole interface.
"""

from memchat.store.account import delete_user_data
from memchat.store.cleanup import (
    count_expired,
    expire_sessions_batch,
    next_xid,
    probe,
    purge_expired_claims,
    purge_idle_rate_buckets,
)
from memchat.store.db import Database, RequestLimits, connect, database_ok
from memchat.store.embeddings import embedding_dimensions, recall, stored_embedding_dimensions
from memchat.store.export import ExportReader, snapshot
from memchat.store.feedback import delete_feedback, set_feedback
from memchat.store.notes import delete_notes, notes_versions, read_notes, restore_notes, save_notes
from memchat.store.records import (
    Caller,
    Cleared,
    Context,
    DueSummary,
    Feedback,
    Hit,
    Limits,
    Notes,
    NotesVersion,
    Replay,
    SessionInfo,
    SourceMessage,
    Summary,
    SummarySource,
    Turn,
)
from memchat.store.sessions import active_session, clear_session, list_sessions
from memchat.store.stats import chat_stats, session_stats
from memchat.store.summaries import (
    claim_due_summaries,
    save_summary,
    summary_done,
    summary_failed,
    summary_lag,
    summary_source,
)
from memchat.store.turns import load_context, record_turn, release_claim

__all__ = [
    "Caller",
    "Cleared",
    "Context",
    "Database",
    "DueSummary",
    "ExportReader",
    "Feedback",
    "Hit",
    "Limits",
    "Notes",
    "NotesVersion",
    "Replay",
    "RequestLimits",
    "SessionInfo",
    "SourceMessage",
    "Summary",
    "SummarySource",
    "Turn",
    "active_session",
    "chat_stats",
    "claim_due_summaries",
    "clear_session",
    "connect",
    "count_expired",
    "database_ok",
    "delete_feedback",
    "delete_notes",
    "delete_user_data",
    "embedding_dimensions",
    "expire_sessions_batch",
    "list_sessions",
    "load_context",
    "next_xid",
    "notes_versions",
    "probe",
    "purge_expired_claims",
    "purge_idle_rate_buckets",
    "read_notes",
    "recall",
    "record_turn",
    "release_claim",
    "restore_notes",
    "save_notes",
    "save_summary",
    "session_stats",
    "set_feedback",
    "snapshot",
    "stored_embedding_dimensions",
    "summary_done",
    "summary_failed",
    "summary_lag",
    "summary_source",
]
