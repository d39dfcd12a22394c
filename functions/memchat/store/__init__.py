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
chat turn's two round trips), embeddings (recall, the column's size),
backfill (the embedding queue), notes, sessions, export, account, feedback,
stats, summaries (the worker's queue), cleanup,
analytics, migrations, users (local dev users), db (connections and the
per-request transaction), fragments (SQL written once).

Callers use the package (`store.load_context(...)`); the names below are
its whole interface.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from memchat.store.account import delete_user_data
    from memchat.store.backfill import (
        claim_embeddings,
        count_unembedded,
        embedding_backlog,
        embedding_statistics,
        embeddings_done,
        embeddings_failed,
        embeddings_pending,
        queue_embeddings,
        queue_unembedded,
        save_embeddings,
        save_facts,
        unembedded,
    )
    from memchat.store.cleanup import (
        count_expired,
        expire_memories_batch,
        expire_sessions_batch,
        next_xid,
        probe,
        purge_expired_claims,
        purge_idle_rate_buckets,
    )
    from memchat.store.db import Database, RequestLimits, connect, database_ok
    from memchat.store.embeddings import (
        adopt_unknown_embeddings,
        embedding_dimensions,
        has_embeddings,
        recall,
        resize_embeddings,
        stored_embedding_dimensions,
    )
    from memchat.store.export import ExportReader, snapshot
    from memchat.store.feedback import delete_feedback, set_feedback
    from memchat.store.imports import (
        FeedbackImport,
        ImportedBatch,
        ImportLimits,
        MessageImport,
        NotesImport,
        SessionImport,
        SummaryImport,
        import_sessions,
        start_import,
    )
    from memchat.store.memories import (
        delete_memory,
        list_memories,
        save_memories,
        search_memories,
    )
    from memchat.store.notes import (
        delete_notes,
        notes_versions,
        read_notes,
        restore_notes,
        save_notes,
    )
    from memchat.store.records import (
        Caller,
        Cleared,
        Context,
        DueEmbeddings,
        DueSummary,
        Embedding,
        EmbeddingBacklog,
        Feedback,
        Hit,
        Limits,
        Memory,
        Neighbour,
        Notes,
        NotesVersion,
        Period,
        RecallQuery,
        Replay,
        SessionInfo,
        SourceMessage,
        Summary,
        SummarySource,
        Turn,
        Unembedded,
    )
    from memchat.store.sessions import (
        ChatHistory,
        active_session,
        agent_names,
        chat_of_history,
        clear_session,
        list_sessions,
    )
    from memchat.store.stats import chat_stats, session_stats
    from memchat.store.summaries import (
        claim_due_summaries,
        remember_summary,
        save_summary,
        summary_done,
        summary_failed,
        summary_lag,
        summary_source,
    )
    from memchat.store.turns import (
        load_context,
        open_turn,
        record_turn,
        release_claim,
        stored_turn,
    )

# Imported on first use (PEP 562): a process loads only the store modules it
# calls (the chat function none of the exports', cleanup's or analytics'),
# and none at import; memchat.snapstart loads them before a snapshot.
_WHERE = {
    "Caller": "memchat.store.records",
    "ChatHistory": "memchat.store.sessions",
    "Cleared": "memchat.store.records",
    "Context": "memchat.store.records",
    "Database": "memchat.store.db",
    "DueEmbeddings": "memchat.store.records",
    "DueSummary": "memchat.store.records",
    "Embedding": "memchat.store.records",
    "EmbeddingBacklog": "memchat.store.records",
    "Period": "memchat.store.records",
    "RecallQuery": "memchat.store.records",
    "ExportReader": "memchat.store.export",
    "Feedback": "memchat.store.records",
    "FeedbackImport": "memchat.store.imports",
    "Hit": "memchat.store.records",
    "Neighbour": "memchat.store.records",
    "ImportLimits": "memchat.store.imports",
    "ImportedBatch": "memchat.store.imports",
    "Limits": "memchat.store.records",
    "MessageImport": "memchat.store.imports",
    "Notes": "memchat.store.records",
    "NotesImport": "memchat.store.imports",
    "NotesVersion": "memchat.store.records",
    "Replay": "memchat.store.records",
    "RequestLimits": "memchat.store.db",
    "SessionImport": "memchat.store.imports",
    "SessionInfo": "memchat.store.records",
    "SourceMessage": "memchat.store.records",
    "Summary": "memchat.store.records",
    "SummaryImport": "memchat.store.imports",
    "SummarySource": "memchat.store.records",
    "Turn": "memchat.store.records",
    "Unembedded": "memchat.store.records",
    "active_session": "memchat.store.sessions",
    "adopt_unknown_embeddings": "memchat.store.embeddings",
    "agent_names": "memchat.store.sessions",
    "chat_of_history": "memchat.store.sessions",
    "chat_stats": "memchat.store.stats",
    "claim_due_summaries": "memchat.store.summaries",
    "remember_summary": "memchat.store.summaries",
    "claim_embeddings": "memchat.store.backfill",
    "clear_session": "memchat.store.sessions",
    "connect": "memchat.store.db",
    "count_expired": "memchat.store.cleanup",
    "count_unembedded": "memchat.store.backfill",
    "database_ok": "memchat.store.db",
    "delete_feedback": "memchat.store.feedback",
    "delete_notes": "memchat.store.notes",
    "delete_user_data": "memchat.store.account",
    "embedding_backlog": "memchat.store.backfill",
    "embedding_dimensions": "memchat.store.embeddings",
    "embedding_statistics": "memchat.store.backfill",
    "embeddings_done": "memchat.store.backfill",
    "embeddings_failed": "memchat.store.backfill",
    "embeddings_pending": "memchat.store.backfill",
    "has_embeddings": "memchat.store.embeddings",
    "expire_sessions_batch": "memchat.store.cleanup",
    "expire_memories_batch": "memchat.store.cleanup",
    "delete_memory": "memchat.store.memories",
    "list_memories": "memchat.store.memories",
    "save_memories": "memchat.store.memories",
    "search_memories": "memchat.store.memories",
    "Memory": "memchat.store.records",
    "start_import": "memchat.store.imports",
    "import_sessions": "memchat.store.imports",
    "list_sessions": "memchat.store.sessions",
    "load_context": "memchat.store.turns",
    "next_xid": "memchat.store.cleanup",
    "open_turn": "memchat.store.turns",
    "notes_versions": "memchat.store.notes",
    "probe": "memchat.store.cleanup",
    "purge_expired_claims": "memchat.store.cleanup",
    "purge_idle_rate_buckets": "memchat.store.cleanup",
    "queue_embeddings": "memchat.store.backfill",
    "queue_unembedded": "memchat.store.backfill",
    "read_notes": "memchat.store.notes",
    "recall": "memchat.store.embeddings",
    "record_turn": "memchat.store.turns",
    "release_claim": "memchat.store.turns",
    "resize_embeddings": "memchat.store.embeddings",
    "restore_notes": "memchat.store.notes",
    "save_embeddings": "memchat.store.backfill",
    "save_facts": "memchat.store.backfill",
    "save_notes": "memchat.store.notes",
    "save_summary": "memchat.store.summaries",
    "session_stats": "memchat.store.stats",
    "set_feedback": "memchat.store.feedback",
    "snapshot": "memchat.store.export",
    "stored_embedding_dimensions": "memchat.store.embeddings",
    "stored_turn": "memchat.store.turns",
    "summary_done": "memchat.store.summaries",
    "summary_failed": "memchat.store.summaries",
    "summary_lag": "memchat.store.summaries",
    "summary_source": "memchat.store.summaries",
    "unembedded": "memchat.store.backfill",
}


def __getattr__(name: str) -> Any:
    import importlib

    if name in _WHERE:
        value = getattr(importlib.import_module(_WHERE[name]), name)
        globals()[name] = value
        return value
    if name in SUBMODULES:
        return importlib.import_module(f"memchat.store.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


SUBMODULES = frozenset(
    {
        "account", "analytics", "backfill", "cleanup", "db", "embeddings", "export", "feedback",
        "fragments", "imports", "migrations", "notes", "records", "sessions", "stats", "summaries",
        "turns", "users",
    }
)  # fmt: skip

__all__ = [
    "Caller",
    "ChatHistory",
    "Cleared",
    "Context",
    "Database",
    "DueEmbeddings",
    "DueSummary",
    "Embedding",
    "EmbeddingBacklog",
    "ExportReader",
    "Feedback",
    "FeedbackImport",
    "Hit",
    "ImportLimits",
    "ImportedBatch",
    "Limits",
    "Memory",
    "MessageImport",
    "Neighbour",
    "Notes",
    "NotesImport",
    "NotesVersion",
    "Period",
    "RecallQuery",
    "Replay",
    "RequestLimits",
    "SessionImport",
    "SessionInfo",
    "SourceMessage",
    "Summary",
    "SummaryImport",
    "SummarySource",
    "Turn",
    "Unembedded",
    "active_session",
    "adopt_unknown_embeddings",
    "agent_names",
    "chat_of_history",
    "chat_stats",
    "claim_due_summaries",
    "claim_embeddings",
    "clear_session",
    "connect",
    "count_expired",
    "count_unembedded",
    "database_ok",
    "delete_feedback",
    "delete_memory",
    "delete_notes",
    "delete_user_data",
    "embedding_backlog",
    "embedding_dimensions",
    "embedding_statistics",
    "embeddings_done",
    "embeddings_failed",
    "embeddings_pending",
    "expire_memories_batch",
    "expire_sessions_batch",
    "has_embeddings",
    "import_sessions",
    "list_memories",
    "list_sessions",
    "load_context",
    "next_xid",
    "notes_versions",
    "open_turn",
    "probe",
    "purge_expired_claims",
    "purge_idle_rate_buckets",
    "queue_embeddings",
    "queue_unembedded",
    "read_notes",
    "recall",
    "record_turn",
    "release_claim",
    "remember_summary",
    "resize_embeddings",
    "restore_notes",
    "save_embeddings",
    "save_facts",
    "save_memories",
    "save_notes",
    "save_summary",
    "search_memories",
    "session_stats",
    "set_feedback",
    "snapshot",
    "start_import",
    "stored_embedding_dimensions",
    "stored_turn",
    "summary_done",
    "summary_failed",
    "summary_lag",
    "summary_source",
    "unembedded",
]
