-- The work queues of the background jobs: the sessions due for a summary
-- refresh (functions/summaries.sql) and those whose messages need
-- embeddings (functions/embeddings.sql). Row-level security, privileges:
-- policies.sql, grants.sql.
--
-- Both alike: the API's role queues the caller's own sessions (the foreign
-- key on the session's whole key, and the policy, say so); the worker
-- (`memchat_worker`) has no right on either table and leases items through
-- SECURITY DEFINER functions, each naming its lease. `next_attempt_at`: a
-- claim leases the row until then; a failure backs off until then;
-- 'infinity': given up until the session is queued again. `lease`: the
-- token the worker's functions take: only a claimed, unexpired item can be
-- read or written by the worker.

-- Queued by a turn (same transaction) once enough messages beyond the
-- window are outside the session's summary.
create table memchat.summary_queue (
  session_id uuid not null,
  user_id uuid not null,
  due_since timestamptz not null default now(),
  attempts integer not null default 0 check (attempts >= 0),
  next_attempt_at timestamptz not null default now(),
  lease uuid,
  primary key (session_id, user_id),
  constraint summary_queue_session_fkey
    foreign key (session_id, user_id) references public.chat_sessions (id, user_id)
    on delete cascade
);
create index summary_queue_next_idx on memchat.summary_queue (next_attempt_at);
create unique index summary_queue_lease_idx on memchat.summary_queue (lease, user_id)
  where lease is not null;

-- Queued after an import (memchat.queue_embeddings) and by a stored
-- embedding whose message needs fact keys (memchat.index_round).
create table memchat.embedding_queue (
  session_id uuid not null,
  user_id uuid not null,
  due_since timestamptz not null default now(),
  attempts integer not null default 0 check (attempts >= 0),
  next_attempt_at timestamptz not null default now(),
  lease uuid,
  primary key (session_id, user_id),
  foreign key (session_id, user_id) references public.chat_sessions (id, user_id)
    on delete cascade
);
comment on table memchat.embedding_queue is
  'Sessions whose user messages need embeddings (the backfill: usecases/backfill.py).';
create index embedding_queue_next_idx on memchat.embedding_queue (next_attempt_at);
create unique index embedding_queue_lease_idx on memchat.embedding_queue (lease, user_id)
  where lease is not null;
