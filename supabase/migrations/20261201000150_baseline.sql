-- The baseline: the schema as supabase/schemas declared it when the
-- 37 migrations before this one (20261121000000 to 20261201000100)
-- were squashed into it, written from those files in the order
-- supabase/config.toml lists them. It is not edited again: a change to the
-- schema is a migration of its own, holding only what changes (docs/deploy.md,
-- "Changing the schema").
--
-- A database that ran the squashed migrations has this schema already:
-- `memchat migrate` records this version as applied there in their place
-- (memchat.store.migrations); on Supabase, `supabase migration repair` does
-- (docs/deploy.md).

-- ======================================================================
-- supabase/schemas/roles_and_schemas.sql
-- ======================================================================

-- The roles memchat adds to Supabase's, its schemas, and pgvector.
--
-- Who can do what (docs/deploy.md, "Roles", states it exactly; a test
-- compares that statement with the catalog):
-- * `authenticated` is the web app through Supabase's Data API (PostgREST):
--   it reads its own rows, deletes its own sessions and upserts its own
--   active-session pointer. Nothing else: no messages, no notes, no expiry.
-- * `memchat_api` is the API functions' login role. It holds no rights of its
--   own (NOINHERIT): every request switches, in its one transaction, to
--   `memchat_user`, so a code path that forgets the switch is refused.
-- * `memchat_user` carries the API's write grants and policies. It is a
--   member of `authenticated`, so it reads exactly as the Data API does and
--   `auth.uid()` works for it on Supabase too (custom roles cannot be given
--   the `auth` schema there; its members can).
-- * `memchat_cleanup` is the TTL cleanup's login role: it sees and deletes
--   expired sessions only, and reads no message content.
-- * `memchat_worker` is the summary worker's and the embedding backfill's
--   login role: it is no member of `memchat_user` and acts only on what a
--   queue hands it, through SECURITY DEFINER functions that take the lease
--   of a claimed queue item.
-- * `memchat_analyst` reads the operator's analytics views
--   (memchat_analytics) and nothing else: no table, no text a user wrote.
-- Roles are created without passwords; docs/deploy.md says how to set them.
-- Roles, their memberships and settings are the server's, not the
-- database's: made if missing, whoever made them.

do $$
begin
  if not exists (select 1 from pg_roles where rolname = 'memchat_user') then
    create role memchat_user nologin inherit;
  end if;
  if not exists (select 1 from pg_roles where rolname = 'memchat_api') then
    create role memchat_api login noinherit;
  end if;
  if not exists (select 1 from pg_roles where rolname = 'memchat_cleanup') then
    create role memchat_cleanup login noinherit;
  end if;
  if not exists (select 1 from pg_roles where rolname = 'memchat_worker') then
    create role memchat_worker login noinherit;
  end if;
  if not exists (select 1 from pg_roles where rolname = 'memchat_analyst') then
    create role memchat_analyst nologin noinherit;
  end if;
end
$$;

grant authenticated to memchat_user;
grant memchat_user to memchat_api;

-- What one statement or one open transaction may hold at most, whatever the
-- code does. The API also sets its own (DB_STATEMENT_TIMEOUT_MS,
-- DB_IDLE_IN_TRANSACTION_TIMEOUT_MS) in every request's transaction; these
-- are the floor under a code path that forgets. Through Supavisor, role
-- settings apply to the server connections it opens as the role.
alter role memchat_api set statement_timeout = '30s';
alter role memchat_api set idle_in_transaction_session_timeout = '60s';
alter role memchat_worker set statement_timeout = '30s';
alter role memchat_worker set idle_in_transaction_session_timeout = '60s';
-- The cleanup's batches are bounded by CLEANUP_BATCH_SIZE and lock_timeout.
alter role memchat_cleanup set statement_timeout = '120s';
alter role memchat_cleanup set idle_in_transaction_session_timeout = '60s';

-- Private helpers and tables live outside `public`, so the Data API never
-- exposes them.
create schema if not exists memchat;

-- The operator's views across all users. Not among the Data API's exposed
-- schemas; only `memchat_analyst` (and the owner) may use it (grants.sql).
create schema memchat_analytics;

-- pgvector, where Supabase keeps extensions (infra/bootstrap.sql makes the
-- same schema on plain PostgreSQL).
create extension if not exists vector with schema extensions;

-- ======================================================================
-- supabase/schemas/functions/partitions.sql
-- ======================================================================

-- Which partition of the recall keys (memchat.message_embeddings,
-- memchat.message_facts: tables/recall_keys.sql) holds a user's rows.
--
-- The keys are hash-partitioned by user_id, so that a caller's HNSW scan
-- walks its partition's graph, where other users' keys are a 32nd of the
-- table's, instead of finding the caller's keys among everyone's
-- (docs/benchmarks.md). Every statement that names the caller (user_id =
-- ...) reads one partition: the planner prunes the others (for a
-- parameter, when the plan starts). Statements that know only message ids
-- (the cascades of deleted messages, functions/cleanup.sql) go to each
-- partition directly, as a delete by ids alone would probe all 32 primary
-- keys per id.
--
-- The number of partitions is fixed. The aim is a partition of a few
-- hundred thousand keys at most; a deployment far beyond 32 times that
-- would re-partition with a migration of its own (and set the partitions'
-- storage parameters again: tables/recall_keys.sql).

create function memchat.key_partitions() returns integer
language sql immutable parallel safe
set search_path = ''
as $$ select 32 $$;

-- The remainder of p_user_id's partition: PostgreSQL's own hash partitioning
-- of one uuid column (uuid_hash_extended with the partition seed, combined
-- with 0, modulo the partitions). Checked against PostgreSQL's routing when
-- the tables are made (tables/recall_keys.sql) and in
-- tests/store/test_recall_scale.py, so a server hashing otherwise fails
-- loudly instead of deleting from the wrong partition. 32 is a power of
-- two: the remainder is the low bits, which the sum keeps without overflow.
create function memchat.key_partition(p_user_id uuid) returns integer
language plpgsql immutable parallel safe
set search_path = ''
as $$
begin
  return (((pg_catalog.uuid_hash_extended(p_user_id, 8816678312871386365) & 31)
           + (x'49a0f4dd15e5a8e3'::bigint & 31)) & 31)::integer;
end
$$;

-- The name of p_user_id's partition of memchat.<p_table>.
create function memchat.key_partition_name(p_table text, p_user_id uuid) returns text
language plpgsql immutable parallel safe
set search_path = ''
as $$
begin
  return p_table || '_p' || pg_catalog.lpad(memchat.key_partition(p_user_id)::text, 2, '0');
end
$$;

-- The same as a relation (null when there is no such table).
create function memchat.key_partition_of(p_table text, p_user_id uuid) returns regclass
language plpgsql stable parallel safe
set search_path = ''
as $$
begin
  return pg_catalog.to_regclass('memchat.' || memchat.key_partition_name(p_table, p_user_id));
end
$$;

-- ======================================================================
-- supabase/schemas/functions/analytics.sql
-- ======================================================================

-- The analytics pseudonyms' key padding (the secret's table, made after
-- this: tables/analytics_key.sql; the views: views.sql).
--
-- HMAC's padded key, `p_key` zero-filled to SHA-256's 64-byte block, each
-- byte xor `p_pad` (0x36 inner, 0x5c outer). Stored with the key (generated
-- columns), so a view computes a pseudonym with two sha256() calls and no
-- per-row key work.
create function memchat.analytics_key_pad(p_key bytea, p_pad integer) returns bytea
language plpgsql immutable strict parallel safe
set search_path = ''
as $$
begin
  return (
    select string_agg(
             set_byte('\x00'::bytea, 0,
                      (case when i < octet_length(p_key) then get_byte(p_key, i) else 0 end)
                      # p_pad),
             ''::bytea order by i)
      from generate_series(0, 63) as i);
end
$$;

-- ======================================================================
-- supabase/schemas/tables/sessions.sql
-- ======================================================================

-- Sessions and each (user, agent)'s active session. Row-level security,
-- privileges: policies.sql, grants.sql; limits: triggers.sql.

-- One row per conversation. Its key is (id, user_id): a session id is the
-- caller's own, so an id another user happens to hold is, for this caller,
-- just an unknown id (nothing answers differently for it), and every
-- reference follows the whole key, so a row can only ever point at a
-- session of its own user.
create table public.chat_sessions (
  id uuid not null default gen_random_uuid(),
  user_id uuid not null references auth.users (id) on delete cascade,
  agent_name text not null default 'default'
    check (agent_name ~ '^[A-Za-z0-9_.-]{1,64}$'),
  title text check (char_length(title) <= 200),
  status text not null default 'active' check (status in ('active', 'cleared')),
  message_count integer not null default 0 check (message_count >= 0),
  summary text,
  created_at timestamptz not null default now(),
  last_active_at timestamptz not null default now(),
  expires_at timestamptz not null default now() + interval '168 hours',
  -- The rolling summary (functions/summaries.sql): the last message it
  -- covers, how many of the session's messages it covers, when it was made.
  summary_covers_until bigint,
  summary_covers_count integer not null default 0 check (summary_covers_count >= 0),
  summary_updated_at timestamptz,
  -- Counters record_turn keeps, so that a user's stats read their sessions'
  -- rows, never their messages (functions/stats.sql).
  turn_count integer not null default 0 check (turn_count >= 0),
  prompt_tokens bigint not null default 0 check (prompt_tokens >= 0),
  completion_tokens bigint not null default 0 check (completion_tokens >= 0),
  primary key (id, user_id)
);
comment on table public.chat_sessions is
  'Session registry: one row per conversation; expires_at slides with every turn.';
comment on column public.chat_sessions.summary is
  'Model-written summary of the messages up to summary_covers_until (background, not instructions).';
comment on column public.chat_sessions.summary_covers_count is
  'How many of the session''s messages (all types) the summary covers.';
comment on column public.chat_sessions.turn_count is
  'Turns answered in this session (kept when it is cleared; restarts when it expires).';
comment on column public.chat_sessions.prompt_tokens is
  'Prompt tokens the model billed for this session''s turns (kept when it is cleared).';
comment on column public.chat_sessions.completion_tokens is
  'Completion tokens the model billed for this session''s turns (kept when it is cleared).';

create index chat_sessions_user_agent_recent_idx
  on public.chat_sessions (user_id, agent_name, last_active_at desc);
create index chat_sessions_user_recent_idx
  on public.chat_sessions (user_id, last_active_at desc);
-- The TTL cleanup walks this index.
create index chat_sessions_expires_at_idx on public.chat_sessions (expires_at);

-- Each (user, agent)'s active session: where a turn without a session id goes.
create table public.user_agent_active_sessions (
  user_id uuid not null references auth.users (id) on delete cascade,
  agent_name text not null check (agent_name ~ '^[A-Za-z0-9_.-]{1,64}$'),
  active_session_id uuid not null,
  last_active_at timestamptz not null default now(),
  created_at timestamptz not null default now(),
  primary key (user_id, agent_name),
  constraint user_agent_active_sessions_active_session_fkey
    foreign key (active_session_id, user_id) references public.chat_sessions (id, user_id)
    on delete cascade
);
-- Serves the cascade from chat_sessions.
create index user_agent_active_sessions_session_idx
  on public.user_agent_active_sessions (active_session_id);

-- ======================================================================
-- supabase/schemas/tables/messages.sql
-- ======================================================================

-- Every stored message. Row-level security, privileges: policies.sql,
-- grants.sql; the triggers (user_id filled in, limits, dependents):
-- triggers.sql.

-- Same core columns as langchain_postgres.PostgresChatMessageHistory, so
-- its get_messages() reads this table as it is. Ids are always generated:
-- an explicit id is refused, and the API's role may insert every column
-- but the id (grants.sql), so no writer picks future ids (the table owner
-- still may, e.g. to restore a dump).
create table public.chat_message_history (
  id bigint generated always as identity primary key,
  session_id uuid not null,
  user_id uuid not null references auth.users (id) on delete cascade,
  message jsonb not null,
  client_message_id text check (char_length(client_message_id) between 1 and 128),
  created_at timestamptz not null default now(),
  constraint chat_message_history_session_fkey
    foreign key (session_id, user_id) references public.chat_sessions (id, user_id)
    on delete cascade
);
comment on column public.chat_message_history.message is
  'LangChain message_to_dict shape: {"type": "human"|"ai"|"tool"|"system", "data": {...}}';

-- The last-N window reads exactly N index entries, whatever the session length.
create index chat_message_history_session_id_idx
  on public.chat_message_history (session_id, id desc);
-- The chat window: the caller's conversational messages of one session,
-- newest first. Led by user_id so the RLS condition is an index condition
-- too (otherwise the planner, with RLS hiding the column statistics,
-- misjudges the session's size and may read it all), and partial on the
-- window's filter so tool traffic never costs a read. The window is then an
-- ordered index scan that stops after N entries.
create index chat_message_history_window_idx
  on public.chat_message_history (user_id, session_id, id desc)
  where message->>'type' <> 'tool'
    and coalesce(jsonb_array_length(message->'data'->'tool_calls'), 0) = 0;
create index chat_message_history_user_idx
  on public.chat_message_history (user_id);
-- A turn's idempotency key, per session of one user (the same key in two
-- users' sessions of the same id are two keys).
create unique index chat_message_history_client_message_idx
  on public.chat_message_history (user_id, session_id, client_message_id)
  where client_message_id is not null;
-- A chat front end's resent history is recognised by the answers memchat
-- stored (memchat.chat_of_history, functions/turns.sql): each final answer
-- by the digest of its trimmed text.
create index chat_message_history_answer_idx
  on public.chat_message_history
  (user_id, (decode(md5(btrim(message->'data'->>'content', E' \t\r\n')), 'hex')))
  where message->>'type' = 'ai'
    and coalesce(jsonb_array_length(message->'data'->'tool_calls'), 0) = 0;

-- ======================================================================
-- supabase/schemas/tables/notes.sql
-- ======================================================================

-- Long-term notes, one text per (user, agent), and their earlier versions.
-- Row-level security, privileges: policies.sql, grants.sql; the triggers
-- (limit, versions): triggers.sql; writing them: functions/notes.sql.

-- `version` counts the writes: the optimistic check of memchat.save_notes.
create table public.agent_long_term_memory (
  id uuid primary key default gen_random_uuid(),
  user_id uuid not null references auth.users (id) on delete cascade,
  agent_name text not null check (agent_name ~ '^[A-Za-z0-9_.-]{1,64}$'),
  notes text not null default '',
  version integer not null default 1 check (version >= 1),
  created_at timestamptz not null default now(),
  updated_at timestamptz not null default now(),
  unique (user_id, agent_name)
);

-- The last memchat.limits.notes_versions_kept versions of every (user,
-- agent)'s notes: an undo for the user (GET /memory/versions, POST
-- /memory/restore), e.g. after the model was talked into wiping them.
-- Written by a trigger as the table owner, so no role can forge history;
-- the caller reads its own; gone with the notes.
create table memchat.notes_versions (
  user_id uuid not null references auth.users (id) on delete cascade,
  agent_name text not null,
  version integer not null check (version >= 1),
  notes text not null,
  created_at timestamptz not null default now(),
  primary key (user_id, agent_name, version)
);
comment on table memchat.notes_versions is
  'Earlier versions of the long-term notes (trigger agent_long_term_memory_versions).';

-- ======================================================================
-- supabase/schemas/tables/limits.sql
-- ======================================================================

-- The limits every writer is held to, whoever writes (the triggers of
-- triggers.sql, functions/limits.sql). One row: raise a limit with
-- `update memchat.limits set ...` (the API's own settings must stay within
-- these; see docs/deploy.md).
create table memchat.limits (
  singleton boolean primary key default true check (singleton),
  -- A user message's text (the API's MAX_MESSAGE_CHARS): what a new turn may
  -- send to the model.
  max_message_chars integer not null default 16000 check (max_message_chars > 0),
  -- Any stored message as JSON: answers, tool calls and results included.
  max_message_bytes integer not null default 262144 check (max_message_bytes >= 1024),
  -- The long-term notes of one (user, agent) (the API's LTM_MAX_CHARS).
  max_notes_chars integer not null default 8000 check (max_notes_chars > 0),
  -- How far ahead a session's expires_at may be set (SESSION_TTL_HOURS).
  max_session_ttl interval not null default interval '168 hours'
    check (max_session_ttl > interval '0'),
  -- How many versions of each (user, agent)'s notes are kept (tables/notes.sql).
  notes_versions_kept integer not null default 20
    check (notes_versions_kept between 1 and 1000),
  -- The most messages a user's live sessions may hold
  -- (USER_MAX_STORED_MESSAGES; functions/limits.sql).
  max_stored_messages bigint not null default 100000 check (max_stored_messages >= 1),
  -- An imported message's text (IMPORT_MAX_MESSAGE_CHARS): it is only
  -- stored, never sent to the model as a new turn is, so it may be longer.
  max_import_message_chars integer not null default 200000
    check (max_import_message_chars >= 1)
);
comment on table memchat.limits is
  'Limits every writer is held to (triggers on the user tables). One row.';
insert into memchat.limits default values;

-- ======================================================================
-- supabase/schemas/tables/throttles.sql
-- ======================================================================

-- Per-user throttles and the turns being answered. Row-level security,
-- privileges: policies.sql, grants.sql; using them: functions/requests.sql,
-- functions/turns.sql.

-- A token bucket per (user, bucket): refilled continuously at the bucket's
-- rate, capped at its burst; each throttled request takes one token. The
-- rates are the API's settings (memchat/throttle.py says which request uses
-- which bucket). Kept when the user's data is deleted (DELETE /me), so
-- deleting cannot reset a throttle; gone with the user (auth.users). A
-- bucket untouched for a day is full again for any sane rate: the cleanup
-- deletes it (it would be made again full).
create table memchat.rate_buckets (
  user_id uuid not null references auth.users (id) on delete cascade,
  bucket text not null check (bucket ~ '^[a-z_]{1,32}$'),
  tokens double precision not null,
  refilled_at timestamptz not null,
  primary key (user_id, bucket)
);
comment on table memchat.rate_buckets is
  'Per-user throttles (token buckets), one row per (user, bucket). Outlive DELETE /me.';

-- A chat turn with a client_message_id claims the key while the model
-- answers, so concurrent retries wait for the stored answer instead of
-- calling the model again. The turn's record deletes the claim; a failed
-- turn releases it; a crashed one expires (and the cleanup deletes it).
create table memchat.turn_claims (
  user_id uuid not null references auth.users (id) on delete cascade,
  client_message_id text not null check (char_length(client_message_id) between 1 and 128),
  message_digest bytea not null,
  expires_at timestamptz not null,
  primary key (user_id, client_message_id)
);

-- ======================================================================
-- supabase/schemas/tables/queues.sql
-- ======================================================================

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
create unique index summary_queue_lease_idx on memchat.summary_queue (lease)
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
create unique index embedding_queue_lease_idx on memchat.embedding_queue (lease)
  where lease is not null;

-- ======================================================================
-- supabase/schemas/tables/feedback.sql
-- ======================================================================

-- A user's ratings of the answers they got. Row-level security, privileges:
-- policies.sql, grants.sql; the stats that read them: functions/stats.sql.
--
-- One rating (-1, 0, 1) and an optional comment per assistant answer, the
-- caller's own only. It goes with its message by the statement-level
-- triggers of triggers.sql (functions/cleanup.sql), not by a foreign key on
-- message_id: a foreign key acts per row, one more query per deleted
-- message, and the TTL cleanup deletes messages by the hundred thousand
-- (docs/benchmarks.md, "Scheduled cleanup"). A trigger does the foreign
-- key's check on insert (memchat.lock_referenced_message).
create table memchat.message_feedback (
  message_id bigint primary key,
  user_id uuid not null default auth.uid() references auth.users (id) on delete cascade,
  session_id uuid not null,
  agent_name text not null,
  rating smallint not null check (rating in (-1, 0, 1)),
  comment text check (comment is null or char_length(comment) <= 2000),
  created_at timestamptz not null default now(),
  updated_at timestamptz not null default now(),
  constraint message_feedback_session_fkey
    foreign key (session_id, user_id) references public.chat_sessions (id, user_id)
    on delete cascade
);
comment on table memchat.message_feedback is
  'A user''s rating of one assistant answer: -1, 0 or 1, and an optional comment. '
  'Goes with its message (trigger chat_message_history_dependents).';
create index message_feedback_user_idx on memchat.message_feedback (user_id, agent_name);
create index message_feedback_session_idx on memchat.message_feedback (session_id);

-- ======================================================================
-- supabase/schemas/tables/recall_keys.sql
-- ======================================================================

-- What recall searches (functions/recall.sql, functions/words.sql): each
-- embedded user message's embedding and the lexemes of its round, and its
-- fact keys; what the backfill has done (functions/embeddings.sql); a copy
-- of the common words. Row-level security, privileges: policies.sql,
-- grants.sql; the triggers: triggers.sql.
--
-- Kept out of `public`, so the Data API never serves vectors, and out of
-- chat_message_history, so LangChain reads that table unchanged. No foreign
-- key to the message: a key goes with its message by the statement-level
-- triggers of triggers.sql (a foreign key acts per deleted row), and a
-- trigger does the foreign key's check on insert.
--
-- Both key tables are hash-partitioned by user (functions/partitions.sql
-- says why), 32 partitions each; every partition has its own HNSW, GIN and
-- btree indexes. The HNSW indexes are made by memchat.index_recall_keys
-- (functions/recall.sql), for the server's pgvector and the column's size.
--
-- The vectors' size must equal EMBEDDING_DIMENSIONS (the API checks it at
-- start: memchat.embedding_dimensions). To change it: `memchat db reembed
-- --dimensions N` (it deletes the embeddings of another size; their
-- messages stay and are embedded again). Both tables' vectors have the
-- same size. pgvector stores vectors out of line by default (EXTERNAL); a
-- 512-float vector is about 2 KB, just past the TOAST threshold, and a
-- per-user scan would then fetch each one from the TOAST table: MAIN keeps
-- it in the row, and the lexemes beside it (the word list reads them for
-- every candidate). A type change resets the storage to EXTERNAL: whoever
-- changes the column sets it again (store.resize_embeddings does).

create table memchat.message_embeddings (
  message_id bigint not null,
  user_id uuid not null,
  session_id uuid not null,
  agent_name text not null,
  created_at timestamptz not null,
  embedding extensions.vector(512) not null,
  model text,
  -- The model whose fact keys the message has: its own model when it says
  -- one thing (no fact keys to make), null while the backfill has fact keys
  -- to make (memchat.index_round); made once memchat.message_facts_made
  -- holds (message, model).
  facts_model text,
  lexemes tsvector,
  -- A unique key of a partitioned table holds the partition's column.
  primary key (message_id, user_id)
) partition by hash (user_id);
alter table memchat.message_embeddings alter column embedding set storage main;
alter table memchat.message_embeddings alter column lexemes set storage main;
comment on table memchat.message_embeddings is
  'The embedding of each stored user message, for recall, partitioned by user '
  '(memchat.key_partition). Goes with its message (trigger chat_message_history_dependents).';
comment on column memchat.message_embeddings.model is
  'The embedding model that made the vector (OPENAI_EMBEDDING_MODEL); recall compares '
  'only vectors of one model. Null: unknown (stored before models were recorded), never '
  'recalled.';
comment on column memchat.message_embeddings.facts_model is
  'The model whose fact keys (memchat.message_facts) the message has; null: not yet.';
comment on column memchat.message_embeddings.lexemes is
  'The full-text lexemes of the message''s round: its text (weight A), its answer''s (B), '
  'and its owner''s lexeme (memchat.owner_lexeme), so that the GIN index finds one user''s rounds.';

-- Fact keys: a user message that says several things ("I'm planning a trip
-- to Miami. By the way, I got my engagement ring resized last week.") is
-- found by each of its sentences in which the user speaks of themselves,
-- embedded apart (chosen by memchat.messages.fact_sentences). Always made by
-- the backfill, off the user's path.
create table memchat.message_facts (
  message_id bigint not null,
  ordinal smallint not null check (ordinal >= 0),
  user_id uuid not null,
  session_id uuid not null,
  agent_name text not null,
  created_at timestamptz not null,
  model text not null,
  embedding extensions.vector(512) not null,
  primary key (message_id, ordinal, user_id)
) partition by hash (user_id);
alter table memchat.message_facts alter column embedding set storage main;
comment on table memchat.message_facts is
  'Extra recall keys of a user message: the embedding of each sentence in which the user '
  'speaks of themselves (memchat.messages.fact_sentences), partitioned by user '
  '(memchat.key_partition). Goes with its message (trigger chat_message_history_dependents).';

-- The partitions. Autovacuum's defaults (analyse after 50 + 10% of the rows
-- changed, vacuum after 1,000 + 20% inserted) suit one table; a 32nd of a
-- young deployment's keys crosses 50 rows with every user's import, and
-- recall's plans are generic (functions/recall.sql): each holds all 32
-- partitions, so an analysis of any one of them throws away every cached
-- recall plan in every connection. A partition is analysed after 5,000 +
-- 10% of its rows changed and vacuumed for inserts after 20,000 + 20%
-- (large partitions are not affected: their 10% is past 5,000); the
-- backfill analyses young ones itself (memchat.embedding_statistics).
-- Storage parameters are the partitions' own (a partitioned table has none
-- to inherit). Row-level security is on in each, with no policy and no
-- grant: only the owner reaches a partition directly.
do $$
declare
  v_table text;
begin
  foreach v_table in array array['message_embeddings', 'message_facts'] loop
    for i in 0 .. memchat.key_partitions() - 1 loop
      execute format('create table memchat.%I partition of memchat.%I'
                     ' for values with (modulus %s, remainder %s)'
                     ' with (autovacuum_analyze_threshold = 5000,'
                     ' autovacuum_vacuum_insert_threshold = 20000)',
                     v_table || '_p' || lpad(i::text, 2, '0'), v_table,
                     memchat.key_partitions(), i);
      execute format('alter table memchat.%I enable row level security',
                     v_table || '_p' || lpad(i::text, 2, '0'));
      execute format('revoke all on memchat.%I from public',
                     v_table || '_p' || lpad(i::text, 2, '0'));
    end loop;
  end loop;
end
$$;

-- PostgreSQL routes rows as memchat.key_partition says.
do $$
declare
  v_user uuid;
begin
  for i in 1 .. 200 loop
    v_user := gen_random_uuid();
    if not pg_catalog.satisfies_hash_partition('memchat.message_embeddings'::regclass,
             memchat.key_partitions(), memchat.key_partition(v_user), v_user) then
      raise exception 'memchat.key_partition(%) is not the partition PostgreSQL routes it to',
        v_user;
    end if;
  end loop;
end
$$;

create index message_embeddings_owner_idx on memchat.message_embeddings (user_id, agent_name);
create index message_facts_owner_idx on memchat.message_facts (user_id, agent_name);
-- The word list's index, without its pending list (fastupdate). With it,
-- new rounds' lexemes wait in one unsorted list, shared by every user,
-- until it passes gin_pending_list_limit or a vacuum merges it, and every
-- word-list query scans that whole list. Without it each round's lexemes go
-- into the index as the round is stored: a little more work per stored
-- embedding, none per search.
create index message_embeddings_lexemes_idx on memchat.message_embeddings using gin (lexemes)
  with (fastupdate = off);

-- Analysed once, empty: the partitions' statistics say 0 rows rather than
-- none (-1), which recall reads as a small partition
-- (memchat.recall_ef_search).
analyze memchat.message_embeddings, memchat.message_facts;

-- A message's fact keys are marked made beside its embedding, not in its
-- row: an embedding row carries the vector and the lexemes, 3-4 KB, and an
-- update of it never stays on its page, so every message the backfill
-- embedded got a second row version and a second entry in each of the
-- table's indexes. A narrow row of its own says the same. It goes with its
-- message by the statement-level triggers (triggers.sql), and with its
-- embedding when `memchat db reembed` deletes embeddings of another size
-- (store.resize_embeddings).
create table memchat.message_facts_made (
  message_id bigint primary key,
  user_id uuid not null,
  model text not null
);
comment on table memchat.message_facts_made is
  'The model a message''s fact keys were made with (memchat.facts_save); see supabase/schemas/tables/recall_keys.sql.';

-- A copy of each recall-key partition's lexeme statistics (pg_stats' most
-- common elements of `lexemes`), which memchat.rarer_words reads by primary
-- key for a message's few words instead of reading the view's row and its
-- 1,000 lexemes at every call. Made by memchat.copy_word_statistics (the
-- backfill's runs, functions/words.sql); used only while it is the
-- partition's latest. What pg_statistic holds (the lexemes common in a
-- partition, many users' words): no role but the owner reads it.
create table memchat.word_statistics (
  partition_name text primary key,
  analysed_at timestamptz not null,
  -- The least share most_common_elem_freqs lists: a lexeme not listed is
  -- at most this common.
  floor real not null
);
comment on table memchat.word_statistics is
  'The copy of a recall-key partition''s lexeme statistics (memchat.copy_word_statistics); see supabase/schemas/tables/recall_keys.sql.';

create table memchat.common_words (
  partition_name text not null references memchat.word_statistics on delete cascade,
  lexeme text not null,
  share real not null,
  primary key (partition_name, lexeme)
);
comment on table memchat.common_words is
  'A recall-key partition''s most common lexemes with their shares of its rows, copied from pg_stats; see supabase/schemas/tables/recall_keys.sql.';

-- ======================================================================
-- supabase/schemas/tables/analytics_key.sql
-- ======================================================================

-- The secret of the operator's analytics pseudonyms (views.sql). Only its
-- owner reads it: row-level security with no policy (policies.sql) and no
-- grant (grants.sql).
--
-- A user's pseudonym is HMAC-SHA256 of the user id (uuid_send's 16 bytes)
-- under this secret; a session's, of the user id's and the session id's
-- bytes (32 bytes). The HMAC is built from core sha256(): the embedded
-- PostgreSQL has no pgcrypto, and on Supabase pgcrypto's
-- `extensions.hmac(uuid_send(id), secret, 'sha256')` gives the same bytes.
-- Rotate the secret (old and new pseudonyms then no longer match) with:
--   update memchat.analytics_key set secret = default, rotated_at = default;
create table memchat.analytics_key (
  singleton boolean primary key default true check (singleton),
  -- 32 random bytes: three v4 uuids (122 random bits each, from the
  -- server's strong random source) hashed together; core functions only.
  secret bytea not null
    default sha256(uuid_send(gen_random_uuid()) || uuid_send(gen_random_uuid())
                   || uuid_send(gen_random_uuid()))
    check (octet_length(secret) between 32 and 64),
  inner_pad bytea generated always as (memchat.analytics_key_pad(secret, 54)) stored,
  outer_pad bytea generated always as (memchat.analytics_key_pad(secret, 92)) stored,
  rotated_at timestamptz not null default now()
);
comment on table memchat.analytics_key is
  'The secret of the analytics pseudonyms (HMAC-SHA256 key); readable by the owner only.'
  ' Rotate: update memchat.analytics_key set secret = default, rotated_at = default;';
insert into memchat.analytics_key default values;

-- ======================================================================
-- supabase/schemas/functions/limits.sql
-- ======================================================================

-- The limits of memchat.limits (tables/limits.sql), held for every writer:
-- the triggers on the user tables (triggers.sql) and the quota on stored
-- messages. SQLSTATE MC413: too large; MC422: not an allowed value; MCQTA:
-- past the quota (DETAIL: the limit).

-- now() + ttl, never beyond the maximum TTL.
create function memchat.session_expiry(p_ttl interval) returns timestamptz
language plpgsql stable
set search_path = ''
as $$
begin
  return now() + least(p_ttl, (select l.max_session_ttl from memchat.limits l));
end
$$;

-- Every stored message: LangChain's shape, a type memchat stores, within
-- the size limits. A user message is held here to the larger of the two
-- text bounds (an imported one may be longer); record_turn holds a new
-- turn's to max_message_chars (what may be sent to the model).
create function memchat.check_message() returns trigger
language plpgsql
set search_path = ''
as $$
declare
  v_limits memchat.limits;
  v_type text := new.message->>'type';
begin
  select * into v_limits from memchat.limits;
  if jsonb_typeof(new.message) is distinct from 'object'
     or jsonb_typeof(new.message->'data') is distinct from 'object' then
    raise exception 'a message must be {"type": ..., "data": {...}}' using errcode = 'MC422';
  end if;
  if v_type is null or v_type not in ('human', 'ai', 'tool') then
    raise exception 'message type % is not allowed', coalesce(v_type, 'null')
      using errcode = 'MC422';
  end if;
  if octet_length(new.message::text) > v_limits.max_message_bytes then
    raise exception 'message is over % bytes', v_limits.max_message_bytes using errcode = 'MC413';
  end if;
  if v_type = 'human'
     and char_length(new.message->'data'->>'content')
         > greatest(v_limits.max_message_chars, v_limits.max_import_message_chars) then
    raise exception 'message is over % characters',
      greatest(v_limits.max_message_chars, v_limits.max_import_message_chars)
      using errcode = 'MC413';
  end if;
  return new;
end
$$;

create function memchat.check_notes() returns trigger
language plpgsql
set search_path = ''
as $$
begin
  if char_length(new.notes) > (select l.max_notes_chars from memchat.limits l) then
    raise exception 'notes are over % characters', (select l.max_notes_chars from memchat.limits l)
      using errcode = 'MC413';
  end if;
  return new;
end
$$;

-- Only a new or moved expiry is checked: lowering the maximum must not make
-- existing sessions impossible to update (clear, say).
create function memchat.check_session() returns trigger
language plpgsql
set search_path = ''
as $$
begin
  if (tg_op = 'INSERT' or new.expires_at is distinct from old.expires_at)
     and new.expires_at > now() + (select l.max_session_ttl from memchat.limits l) then
    raise exception 'expires_at is beyond the maximum session TTL' using errcode = 'MC422';
  end if;
  return new;
end
$$;

-- The quota: the most messages a user's live sessions may hold
-- (max_stored_messages). An expired session holds none (it is gone for
-- every purpose, whether or not the cleanup has deleted it yet). Every
-- write of messages (a chat turn, an import) is refused whole past it,
-- under a lock per user, so two writes at once cannot both pass it.

-- The caller's messages: those of their live sessions (each session keeps
-- its count; a cleared one counts 0).
create function memchat.stored_messages() returns bigint
language plpgsql stable
set search_path = ''
as $$
begin
  return (select coalesce(sum(s.message_count), 0)::bigint from public.chat_sessions s
           where s.user_id = (select auth.uid()) and s.expires_at > now());
end
$$;

-- The lower of memchat.limits' and the API's own (USER_MAX_STORED_MESSAGES,
-- set in each request's transaction as memchat.max_stored_messages:
-- store/db.py's SET_CLAIMS).
create function memchat.max_stored_messages() returns bigint
language plpgsql stable
set search_path = ''
as $$
declare
  v_api text := pg_catalog.current_setting('memchat.max_stored_messages', true);
begin
  return least((select l.max_stored_messages from memchat.limits l),
               case when v_api ~ '^[0-9]{1,18}$' then v_api::bigint end);
end
$$;

-- Raises MCQTA (DETAIL: the limit) when storing p_adding more messages
-- would take the caller past max_stored_messages. The lock (per user, to
-- the transaction's end: safe behind a transaction-mode pooler) makes a
-- concurrent write wait until this one has committed and counts it.
create function memchat.hold_stored_messages(p_adding bigint) returns void
language plpgsql
set search_path = ''
as $$
declare
  v_max bigint := memchat.max_stored_messages();
  v_stored bigint;
begin
  perform pg_catalog.pg_advisory_xact_lock(
    pg_catalog.hashtextextended('memchat.stored_messages/' || auth.uid()::text, 0));
  v_stored := memchat.stored_messages();
  if v_stored + p_adding > v_max then
    raise exception 'storing % more messages would pass the limit of % (% stored)',
      p_adding, v_max, v_stored
      using errcode = 'MCQTA', detail = v_max::text;
  end if;
end
$$;

-- ======================================================================
-- supabase/schemas/functions/requests.sql
-- ======================================================================

-- What the API's requests call in their own transaction: whether the
-- caller still exists, and the throttles (tables/throttles.sql).

-- Whether the caller of this request still exists (a deleted user's token
-- is refused). SECURITY DEFINER: the API's role cannot read auth.users.
create function memchat.current_user_exists() returns boolean
language plpgsql stable security definer
set search_path = ''
as $$
begin
  return exists (select 1 from auth.users u where u.id = (select auth.uid()));
end
$$;

-- Takes a token from the caller's bucket; returns 0 if it got one, else the
-- seconds until one is available (and takes nothing). Concurrent requests of
-- one user queue on the bucket's row for the rest of their transaction.
create function memchat.take_rate_token(
  p_bucket text, p_per_minute double precision, p_burst integer
) returns double precision
language plpgsql
set search_path = ''
as $$
declare
  v_uid uuid := auth.uid();
  v_level double precision;
begin
  if p_per_minute <= 0 or not memchat.current_user_exists() then
    -- A deleted user's request is refused anyway (its transaction's
    -- existence check); it keeps no bucket.
    return 0;
  end if;
  insert into memchat.rate_buckets (user_id, bucket, tokens, refilled_at)
  values (v_uid, p_bucket, p_burst, now())
  on conflict (user_id, bucket) do nothing;
  select least(p_burst::double precision,
               r.tokens + greatest(0, extract(epoch from now() - r.refilled_at))
                          * p_per_minute / 60)
    into v_level
    from memchat.rate_buckets r where r.user_id = v_uid and r.bucket = p_bucket
     for update;
  if v_level < 1 then
    return (1 - v_level) * 60 / p_per_minute;
  end if;
  update memchat.rate_buckets r
     set tokens = v_level - 1, refilled_at = greatest(r.refilled_at, now())
   where r.user_id = v_uid and r.bucket = p_bucket;
  return 0;
end
$$;

-- take_rate_token for any request's transaction: out of tokens raises
-- SQLSTATE MC429 (DETAIL: the seconds to wait), so the request's other
-- statements, sent in the same pipeline, never run.
create function memchat.throttle(p_bucket text, p_per_minute double precision, p_burst integer)
returns void
language plpgsql
set search_path = ''
as $$
declare
  v_retry double precision := memchat.take_rate_token(p_bucket, p_per_minute, p_burst);
begin
  if v_retry > 0 then
    raise exception 'rate limited (%)', p_bucket
      using errcode = 'MC429', detail = v_retry::text;
  end if;
end
$$;

-- ======================================================================
-- supabase/schemas/functions/notes.sql
-- ======================================================================

-- The long-term notes (tables/notes.sql): writing them, their versions,
-- restoring one.

-- Writes the caller's notes for an agent with an optimistic version check:
-- p_expected_version null = unconditional, 0 = "there were no notes",
-- n = "the notes I read had version n". A mismatch raises SQLSTATE MC409
-- so the whole transaction rolls back and the caller can re-read and retry.
create function memchat.save_notes(p_agent_name text, p_notes text, p_expected_version integer)
returns integer
language plpgsql
set search_path = ''
as $$
declare
  v_version integer;
begin
  if p_expected_version is null then
    insert into public.agent_long_term_memory as m (user_id, agent_name, notes)
    values ((select auth.uid()), p_agent_name, p_notes)
    on conflict (user_id, agent_name) do update
      set notes = excluded.notes, version = m.version + 1, updated_at = now()
    returning m.version into v_version;
  elsif p_expected_version = 0 then
    insert into public.agent_long_term_memory as m (user_id, agent_name, notes)
    values ((select auth.uid()), p_agent_name, p_notes)
    on conflict (user_id, agent_name) do nothing
    returning m.version into v_version;
  else
    update public.agent_long_term_memory as m
       set notes = p_notes, version = m.version + 1, updated_at = now()
     where m.user_id = (select auth.uid()) and m.agent_name = p_agent_name
       and m.version = p_expected_version
    returning m.version into v_version;
  end if;
  if v_version is null then
    raise exception 'long-term notes of agent % changed concurrently', p_agent_name
      using errcode = 'MC409';
  end if;
  return v_version;
end
$$;

-- The caller's notes of an agent set back to an earlier version's text (a
-- new version; p_expected_version as in memchat.save_notes). Null when there
-- is no such version.
create function memchat.restore_notes(
  p_agent_name text, p_version integer, p_expected_version integer
) returns integer
language plpgsql
set search_path = ''
as $$
declare
  v_notes text;
begin
  select v.notes into v_notes from memchat.notes_versions v
   where v.user_id = (select auth.uid()) and v.agent_name = p_agent_name
     and v.version = p_version;
  if not found then
    return null;
  end if;
  return memchat.save_notes(p_agent_name, v_notes, p_expected_version);
end
$$;

-- The trigger that keeps the versions (trigger
-- agent_long_term_memory_versions): every write of the notes is a version,
-- the last memchat.limits.notes_versions_kept of them kept; deleting the
-- notes deletes them. SECURITY DEFINER, so no role writes versions itself.
create function memchat.keep_notes_version() returns trigger
language plpgsql
security definer
set search_path = ''
as $$
begin
  if tg_op = 'DELETE' then
    delete from memchat.notes_versions v
     where v.user_id = old.user_id and v.agent_name = old.agent_name;
    return null;
  end if;
  insert into memchat.notes_versions (user_id, agent_name, version, notes, created_at)
  values (new.user_id, new.agent_name, new.version, new.notes, new.updated_at)
  on conflict (user_id, agent_name, version) do update
     set notes = excluded.notes, created_at = excluded.created_at;
  delete from memchat.notes_versions v
   where v.user_id = new.user_id and v.agent_name = new.agent_name
     and v.version <= new.version - (select l.notes_versions_kept from memchat.limits l);
  return null;
end
$$;

-- ======================================================================
-- supabase/schemas/functions/turns.sql
-- ======================================================================

-- A chat turn's two round trips, as two functions: load_context before the
-- model is called, record_turn after. PL/pgSQL keeps each statement's plan
-- for the life of the server connection, which works behind a
-- transaction-mode pooler (no named prepared statements), and saves
-- re-planning the same statements on every turn. Both run as the caller
-- (security invoker): row-level security applies to every statement.
--
-- Their plans are generic (plan_cache_mode = force_generic_plan): they read
-- and write the caller's rows by key, where a plan made for each call's
-- values is no better than the connection's generic one (left to auto,
-- load_context's notes lookup was planned at every call where the user had
-- no notes; tests/store/test_plans.py counts the plans).

-- Resolve the session and read what a turn starts from, in one call:
-- {"idempotency": "conflict"}           the key was used with another message
-- {"idempotency": "in_flight"}          the same turn is being answered now
-- {"throttled": seconds}                out of chat tokens: retry after
-- {"taken": false, "session", "replay"} the stored answer of this key (the
--                                       ids of the stored messages with it)
-- {"taken": false, "session", "notes", "messages", "summary", "claimed",
--  "stored_messages", "limits"}
-- The session is the caller's own of p_session_id (another user's id is an
-- unknown id to this caller), else the active one of p_agent_name. With
-- p_client_message_id, the key is claimed for p_claim_seconds. The throttle
-- is memchat.rate_buckets' bucket 'chat'. The window reaches back to the
-- summary: the messages the summary does not cover yet stay in the window
-- (at most p_read_max of them), so a summary is usable between refreshes,
-- not only right after one; only when even p_read_max messages do not reach
-- it back (the worker is behind) is it left out, as a hole would make it
-- misleading. The caller's stored messages and the quota come with it, so
-- a turn past the quota is refused before the model is called.
-- Every read is a key lookup or the top N of one index range: when the
-- planner underestimates a session's size it may prefer a bitmap scan that
-- reads the whole session and sorts it; the ordered index scan is never
-- worse (enable_bitmapscan = off).
create function memchat.load_context(
  p_session_id uuid, p_agent_name text, p_window integer, p_read_notes boolean,
  p_client_message_id text, p_message text, p_rate_per_minute double precision,
  p_rate_burst integer, p_claim_seconds double precision, p_read_max integer
)
returns jsonb
language plpgsql
set search_path = ''
set enable_bitmapscan = off
set plan_cache_mode = force_generic_plan
as $function$
declare
  v_uid uuid := auth.uid();
  v_session public.chat_sessions;
  v_session_json jsonb;
  v_notes jsonb;
  v_messages jsonb := '[]'::jsonb;
  v_summary jsonb;
  v_stored text;
  v_replay jsonb;
  v_same boolean;
  v_retry double precision;
  v_digest bytea;
  v_with_summary boolean;
  v_read integer;
  v_recent record;
  v_ids bigint[] := '{}';
  v_bodies jsonb[] := '{}';
  v_keep integer;
begin
  if p_session_id is not null then
    select s.* into v_session from public.chat_sessions s
     where s.id = p_session_id and s.user_id = v_uid;
  else
    select s.* into v_session
      from public.user_agent_active_sessions a
      join public.chat_sessions s on s.id = a.active_session_id and s.user_id = a.user_id
     where a.user_id = v_uid and a.agent_name = p_agent_name
       and s.status = 'active' and s.expires_at > now();
  end if;
  if v_session.id is not null then
    v_session_json := to_jsonb(v_session)
      || jsonb_build_object('expired', v_session.expires_at <= now());
  end if;

  if p_client_message_id is not null then
    if v_session.id is not null then
      select u.message->'data'->>'content',
             case when a.id is not null then jsonb_build_object(
               'message', a.message, 'message_id', a.id, 'user_message_id', u.id) end
        into v_stored, v_replay
        from public.chat_message_history u
        left join lateral (
             select x.id, x.message from public.chat_message_history x
              where x.user_id = v_uid and x.session_id = u.session_id and x.id > u.id
                and x.message->>'type' = 'ai'
                and coalesce(jsonb_array_length(x.message->'data'->'tool_calls'), 0) = 0
              order by x.id limit 1) a on true
       where u.user_id = v_uid and u.session_id = v_session.id
         and u.client_message_id = p_client_message_id;
      if found then
        if v_stored is distinct from p_message then
          return jsonb_build_object('idempotency', 'conflict');
        end if;
        if v_replay is not null then
          return jsonb_build_object('taken', false, 'session', v_session_json,
                                    'replay', v_replay);
        end if;
      end if;
    end if;
    v_digest := sha256(convert_to(coalesce(p_message, ''), 'UTF8'));
    select c.message_digest = v_digest into v_same
      from memchat.turn_claims c
     where c.user_id = v_uid and c.client_message_id = p_client_message_id
       and c.expires_at > now();
    if found then
      return jsonb_build_object('idempotency', case when v_same then 'in_flight' else 'conflict' end);
    end if;
  end if;

  if p_rate_per_minute > 0 or p_client_message_id is not null then
    -- What this transaction writes (a throttle token, a turn claim) may be
    -- lost in a server crash without harm, so its commit does not wait for
    -- the WAL flush: the turn's first round trip stays a read's.
    perform set_config('synchronous_commit', 'off', true);
  end if;

  if p_rate_per_minute > 0 then
    v_retry := memchat.take_rate_token('chat', p_rate_per_minute, p_rate_burst);
    if v_retry > 0 then
      return jsonb_build_object('throttled', v_retry);
    end if;
  end if;

  if p_client_message_id is not null then
    insert into memchat.turn_claims as c (user_id, client_message_id, message_digest, expires_at)
    values (v_uid, p_client_message_id, v_digest,
            now() + make_interval(secs => p_claim_seconds))
    on conflict (user_id, client_message_id) do update
       set message_digest = excluded.message_digest, expires_at = excluded.expires_at
     where c.expires_at <= now()
    returning true into v_same;
    if v_same is null then
      -- A concurrent request claimed it first (its row was not yet visible).
      return jsonb_build_object('idempotency', 'in_flight');
    end if;
  end if;

  if p_read_notes then
    select jsonb_build_object('notes', m.notes, 'version', m.version, 'updated_at', m.updated_at)
      into v_notes
      from public.agent_long_term_memory m
     where m.user_id = v_uid and m.agent_name = coalesce(v_session.agent_name, p_agent_name);
  end if;

  if v_session.id is not null and v_session.expires_at > now() then
    v_with_summary := v_session.summary is not null and p_read_notes;
    -- With a summary, one more than the most it may keep: the message the
    -- summary ends with, which shows that nothing lies between.
    v_read := case when v_with_summary then greatest(p_window, p_read_max) + 1 else p_window end;
    -- Walks chat_message_history_window_idx and stops after v_read entries.
    for v_recent in
      select h.id, h.message from public.chat_message_history h
       where h.user_id = v_uid and h.session_id = v_session.id
         and h.message->>'type' <> 'tool'
         and coalesce(jsonb_array_length(h.message->'data'->'tool_calls'), 0) = 0
       order by h.id desc
       limit v_read
    loop
      v_ids := v_ids || v_recent.id;
      v_bodies := v_bodies || v_recent.message;
    end loop;
    v_keep := least(p_window, cardinality(v_ids));
    -- The summary is usable when what was read reaches back to it (or is
    -- the whole session): then every message after it is in the window.
    if v_with_summary and (cardinality(v_ids) < v_read
                           or v_ids[cardinality(v_ids)] <= v_session.summary_covers_until) then
      while v_keep < cardinality(v_ids) and v_ids[v_keep + 1] > v_session.summary_covers_until loop
        v_keep := v_keep + 1;
      end loop;
      v_summary := jsonb_build_object(
        'text', v_session.summary,
        'covers_until', v_session.summary_covers_until,
        'updated_at', v_session.summary_updated_at);
    end if;
    select coalesce(jsonb_agg(b.body order by b.ord desc), '[]'::jsonb) into v_messages
      from unnest(v_bodies[1:v_keep]) with ordinality as b(body, ord);
  end if;

  return jsonb_build_object(
    'taken', false,
    'session', v_session_json,
    'notes', v_notes,
    'messages', v_messages,
    'summary', v_summary,
    'replay', null,
    'claimed', p_client_message_id is not null,
    'stored_messages', memchat.stored_messages(),
    'limits', (select jsonb_build_object(
                 'max_stored_messages', memchat.max_stored_messages(),
                 'max_message_chars', l.max_message_chars,
                 'max_notes_chars', l.max_notes_chars,
                 'max_session_ttl_seconds', extract(epoch from l.max_session_ttl))
                 from memchat.limits l));
end
$function$;

-- Store a whole turn atomically and return the session as JSON, with the
-- ids of the messages it stored (`message_ids`: the user's first, the
-- answer last). The session row is locked first, so concurrent turns on one
-- session queue up and each turn's messages get consecutive ids. A turn on
-- an expired session that cleanup has not reached yet starts the
-- conversation over (its messages and summary go). Also:
-- * p_new_session: the caller had no session and none was active; if
--   another turn made one active meanwhile (two first messages at once),
--   this turn joins it instead of starting a second conversation.
-- * p_notes null: the notes were not changed; else saved with the version
--   check of memchat.save_notes (SQLSTATE MC409 on a concurrent change).
-- * p_embedding: the user message's embedding, made by p_embedding_model
--   (null when it could not be made: the backfill does it later).
-- * p_due_after: a session with that many messages or more outside its
--   summary is queued for the summary worker (a given-up one is retried).
-- * The session's turn and token counters, from the usage the assistant
--   messages carry; the quota (memchat.hold_stored_messages).
create function memchat.record_turn(
  p_session_id uuid, p_agent_name text, p_title text, p_messages jsonb, p_ttl interval,
  p_client_message_id text, p_notes text, p_notes_version integer, p_new_session boolean,
  p_embedding extensions.vector, p_embedding_model text, p_due_after integer
)
returns jsonb
language plpgsql
set search_path = ''
set plan_cache_mode = force_generic_plan
as $function$
declare
  v_uid uuid := auth.uid();
  v_count integer := jsonb_array_length(p_messages);
  v_session public.chat_sessions;
  v_expired boolean;
  v_active uuid;
  v_ids bigint[];
  v_prompt bigint;
  v_completion bigint;
begin
  -- A new turn's user message is held to max_message_chars (what may be
  -- sent to the model); the messages' trigger holds every stored one only to
  -- the larger bound an imported message has.
  if exists (select 1 from jsonb_array_elements(p_messages) m
              where m->>'type' = 'human'
                and char_length(m->'data'->>'content')
                    > (select l.max_message_chars from memchat.limits l)) then
    raise exception 'message is over % characters',
      (select l.max_message_chars from memchat.limits l) using errcode = 'MC413';
  end if;
  perform memchat.hold_stored_messages(v_count);

  -- The turn's token usage: what its assistant messages carry (LangChain's
  -- usage_metadata; the final answer holds the whole turn's).
  select coalesce(sum((m->'data'->'usage_metadata'->>'input_tokens')::bigint), 0),
         coalesce(sum((m->'data'->'usage_metadata'->>'output_tokens')::bigint), 0)
    into v_prompt, v_completion
    from jsonb_array_elements(p_messages) m
   where m->>'type' = 'ai' and jsonb_typeof(m->'data'->'usage_metadata') = 'object';

  if p_new_session then
    -- Serialises the first turns of one (user, agent); the lock ends with
    -- the transaction, so it is safe behind a transaction-mode pooler.
    perform pg_advisory_xact_lock(
      hashtextextended('memchat.new_session/' || v_uid::text || '/' || p_agent_name, 0));
    select s.id into v_active
      from public.user_agent_active_sessions a
      join public.chat_sessions s on s.id = a.active_session_id and s.user_id = a.user_id
     where a.user_id = v_uid and a.agent_name = p_agent_name
       and s.status = 'active' and s.expires_at > now();
    p_session_id := coalesce(v_active, p_session_id);
  end if;

  select s.expires_at <= now() into v_expired
    from public.chat_sessions s where s.id = p_session_id and s.user_id = v_uid for update;
  if v_expired then
    delete from public.chat_message_history h
     where h.user_id = v_uid and h.session_id = p_session_id;
  end if;

  insert into public.chat_sessions as s
      (id, user_id, agent_name, title, message_count, last_active_at, expires_at,
       turn_count, prompt_tokens, completion_tokens)
  values (p_session_id, v_uid, p_agent_name, p_title, v_count, now(),
          memchat.session_expiry(p_ttl), 1, v_prompt, v_completion)
  on conflict (id, user_id) do update set
      message_count = case when s.expires_at <= now() then excluded.message_count
                           else s.message_count + excluded.message_count end,
      turn_count = case when s.expires_at <= now() then 1 else s.turn_count + 1 end,
      prompt_tokens = case when s.expires_at <= now() then excluded.prompt_tokens
                           else s.prompt_tokens + excluded.prompt_tokens end,
      completion_tokens = case when s.expires_at <= now() then excluded.completion_tokens
                               else s.completion_tokens + excluded.completion_tokens end,
      summary = case when s.expires_at <= now() then null else s.summary end,
      summary_covers_until =
        case when s.expires_at <= now() then null else s.summary_covers_until end,
      summary_covers_count =
        case when s.expires_at <= now() then 0 else s.summary_covers_count end,
      summary_updated_at =
        case when s.expires_at <= now() then null else s.summary_updated_at end,
      title = coalesce(s.title, excluded.title),
      status = 'active',
      last_active_at = excluded.last_active_at,
      expires_at = excluded.expires_at
  returning s.* into v_session;

  with inserted as (
    insert into public.chat_message_history (session_id, user_id, message, client_message_id)
    select p_session_id, v_uid, m.message, case when m.ord = 1 then p_client_message_id end
      from jsonb_array_elements(p_messages) with ordinality as m(message, ord)
     order by m.ord
    returning id)
  select array_agg(i.id order by i.id) into v_ids from inserted i;

  -- The first message of a turn is the user's.
  if p_embedding is not null then
    insert into memchat.message_embeddings
        (message_id, user_id, session_id, agent_name, created_at, model, embedding)
    values (v_ids[1], v_uid, p_session_id, v_session.agent_name, now(), p_embedding_model,
            p_embedding);
  end if;

  insert into public.user_agent_active_sessions as a
      (user_id, agent_name, active_session_id, last_active_at)
  values (v_uid, v_session.agent_name, p_session_id, now())
  on conflict (user_id, agent_name) do update set
      active_session_id = excluded.active_session_id,
      last_active_at = excluded.last_active_at;

  if p_notes is not null then
    perform memchat.save_notes(v_session.agent_name, p_notes, p_notes_version);
  end if;

  if p_client_message_id is not null then
    delete from memchat.turn_claims c
     where c.user_id = v_uid and c.client_message_id = p_client_message_id;
  end if;

  if p_due_after is not null
     and v_session.message_count - v_session.summary_covers_count >= p_due_after then
    insert into memchat.summary_queue as q (session_id, user_id)
    values (p_session_id, v_uid)
    on conflict (session_id, user_id) do update set attempts = 0, next_attempt_at = now()
     where q.next_attempt_at = 'infinity';
  end if;

  -- The ids of the turn's messages, in order: the user's first, the answer last.
  return to_jsonb(v_session) || jsonb_build_object('message_ids', to_jsonb(v_ids));
end
$function$;

-- Fills user_id from the session when an insert leaves it out (LangChain's
-- add_messages does): the caller's own session of that id. Runs as the
-- inserting role, so row-level security still applies.
create function memchat.fill_message_user_id() returns trigger
language plpgsql
set search_path = ''
as $$
begin
  if new.user_id is null then
    select s.user_id into new.user_id from public.chat_sessions s
     where s.id = new.session_id
     order by s.user_id = (select auth.uid()) desc nulls last
     limit 1;
  end if;
  return new;
end
$$;

-- Which session a chat front end's resent history belongs to, and that
-- history as memchat stored it (POST /v1/chat/completions without a session
-- or chat id; docs/api.md, "Which session"). A Chat Completions client
-- resends its whole chat on every call; memchat recognises the chat by the
-- answers it stored: the session that holds the client's last answer
-- (after the same question) is the chat's, and the window sent to the model
-- is the client's earlier exchanges as memchat stored them (each answer
-- found by its text, after the same question, in that session), never the
-- client's copy and never another chat's messages that happen to share the
-- session. An answer is found by the digest of its trimmed text, through
-- chat_message_history_answer_idx (tables/messages.sql).
-- p_questions, p_answers: the client's exchanges, oldest first (a question
-- may be null: an answer with no user message before it). Returns
-- {"session_id": the session holding the last answer after its question,
-- the newest such among the caller's live sessions of p_agent_name, or
-- null; "messages": that session's stored question and answer of each of
-- the last p_limit exchanges found in it, oldest first (LangChain's shape)}.
create function memchat.chat_of_history(
  p_agent_name text, p_questions text[], p_answers text[], p_limit integer
) returns jsonb
language plpgsql stable
set search_path = ''
as $$
declare
  v_uid uuid := auth.uid();
  v_last integer := cardinality(p_answers);
  v_session uuid;
  v_messages jsonb;
begin
  if v_last is null or v_last = 0 then
    return jsonb_build_object('session_id', null, 'messages', '[]'::jsonb);
  end if;
  select h.session_id into v_session
    from public.chat_message_history h
    join public.chat_sessions s on s.id = h.session_id and s.user_id = h.user_id
   where h.user_id = v_uid
     and decode(md5(btrim(h.message->'data'->>'content', E' \t\r\n')), 'hex')
         = decode(md5(btrim(p_answers[v_last], E' \t\r\n')), 'hex')
     and h.message->>'type' = 'ai'
     and coalesce(jsonb_array_length(h.message->'data'->'tool_calls'), 0) = 0
     and s.agent_name = p_agent_name and s.status = 'active' and s.expires_at > now()
     and (select q.message->'data'->>'content' from public.chat_message_history q
           where q.user_id = v_uid and q.session_id = h.session_id and q.id < h.id
             and q.message->>'type' = 'human'
           order by q.id desc limit 1) is not distinct from btrim(p_questions[v_last], E' \t\r\n')
   order by h.id desc
   limit 1;
  if v_session is null then
    return jsonb_build_object('session_id', null, 'messages', '[]'::jsonb);
  end if;

  -- Each exchange once: its answer's newest stored copy in the session.
  with given as (
    select g.question, decode(md5(btrim(g.answer, E' \t\r\n')), 'hex') as digest, g.ord
      from unnest(p_questions, p_answers) with ordinality as g(question, answer, ord)
     order by g.ord desc
     limit p_limit
  ), found as (
    select distinct on (a.id) a.id, a.message as answer, q.message as question, g.ord
      from given g
      join lateral (
        select h.id, h.message from public.chat_message_history h
         where h.user_id = v_uid and h.session_id = v_session
           and decode(md5(btrim(h.message->'data'->>'content', E' \t\r\n')), 'hex') = g.digest
           and h.message->>'type' = 'ai'
           and coalesce(jsonb_array_length(h.message->'data'->'tool_calls'), 0) = 0
         order by h.id desc
         limit 1) a on true
      left join lateral (
        select x.message from public.chat_message_history x
         where x.user_id = v_uid and x.session_id = v_session and x.id < a.id
           and x.message->>'type' = 'human'
         order by x.id desc
         limit 1) q on true
     where btrim(q.message->'data'->>'content', E' \t\r\n')
           is not distinct from btrim(g.question, E' \t\r\n')
     order by a.id, g.ord
  )
  select coalesce(jsonb_agg(m.message order by f.id, m.part), '[]'::jsonb) into v_messages
    from found f
    cross join lateral (values (1, f.question), (2, f.answer)) as m(part, message)
   where m.message is not null;
  return jsonb_build_object('session_id', v_session, 'messages', v_messages);
end
$$;

-- ======================================================================
-- supabase/schemas/functions/summaries.sql
-- ======================================================================

-- Rolling summaries: each long session keeps a summary of the messages that
-- left its window (chat_sessions.summary*), refreshed by the summary worker,
-- never in a turn. A turn queues its session (memchat.summary_queue,
-- tables/queues.sql; memchat.record_turn) once enough messages beyond the
-- window are outside the summary, in the turn's transaction.
--
-- The worker logs in as `memchat_worker` and is no member of
-- `memchat_user`: it may call these functions and nothing else. They are
-- SECURITY DEFINER and act only on what a live lease holds: the queue item
-- the worker claimed, that session, its owner's rows.

-- Lease up to p_limit due items for p_lease_seconds (FOR UPDATE SKIP LOCKED:
-- another worker skips them): [{"lease", "session_id", "attempts"}]. The
-- owner's id stays in the database.
create function memchat.summary_claim(p_limit integer, p_lease_seconds double precision)
returns jsonb
language plpgsql
security definer
set search_path = ''
as $$
declare
  v_leased jsonb;
begin
  with due as (
    select d.session_id, d.user_id from memchat.summary_queue d
     where d.next_attempt_at <= now()
     order by d.next_attempt_at
     limit p_limit
       for update skip locked
  ), leased as (
    update memchat.summary_queue q
       set next_attempt_at = now() + make_interval(secs => p_lease_seconds),
           lease = gen_random_uuid()
      from due
     where q.session_id = due.session_id and q.user_id = due.user_id
    returning q.lease, q.session_id, q.attempts
  )
  select coalesce(jsonb_agg(jsonb_build_object(
           'lease', l.lease, 'session_id', l.session_id, 'attempts', l.attempts)), '[]'::jsonb)
    into v_leased
    from leased l;
  return v_leased;
end
$$;

-- Seconds the oldest due item has been waiting (null: none is due).
create function memchat.summary_lag() returns double precision
language plpgsql stable
security definer
set search_path = ''
as $$
begin
  return (select extract(epoch from now() - min(q.due_since))::double precision
            from memchat.summary_queue q where q.next_attempt_at <> 'infinity');
end
$$;

-- The queue item a live lease holds (null: expired, taken over, or never).
create function memchat.summary_leased(p_lease uuid) returns memchat.summary_queue
language plpgsql stable security definer
set search_path = ''
as $$
declare
  v_item memchat.summary_queue;
begin
  select q.* into v_item from memchat.summary_queue q
   where q.lease = p_lease and q.next_attempt_at > now();
  return v_item;
end
$$;

-- What one refresh of a leased item summarizes: its summary so far and the
-- conversational messages after it that have left the window of p_window
-- (at most p_chunk, oldest first), as {"summary", "covers_until",
-- "messages": [{"id", "type", "content"}], "boundary"}; null when there is
-- nothing (left) to summarize or the lease is not live. Only that session,
-- only its owner's rows.
create function memchat.summary_source(p_lease uuid, p_window integer, p_chunk integer)
returns jsonb
language plpgsql stable
security definer
set search_path = ''
as $$
declare
  v_item memchat.summary_queue := memchat.summary_leased(p_lease);
  v_session public.chat_sessions;
  v_floor bigint;
  v_messages jsonb;
  v_last bigint;
begin
  if v_item.session_id is null then
    return null;
  end if;
  select s.* into v_session from public.chat_sessions s
   where s.id = v_item.session_id and s.user_id = v_item.user_id
     and s.status = 'active' and s.expires_at > now();
  if v_session.id is null then
    return null;
  end if;
  -- The window's oldest message: only what is older has left the window.
  select min(w.id) into v_floor
    from (select h.id from public.chat_message_history h
           where h.user_id = v_item.user_id and h.session_id = v_item.session_id
             and h.message->>'type' <> 'tool'
             and coalesce(jsonb_array_length(h.message->'data'->'tool_calls'), 0) = 0
           order by h.id desc
           limit p_window) w;
  select coalesce(jsonb_agg(jsonb_build_object(
           'id', m.id, 'type', m.message->>'type',
           'content', left(m.message->'data'->>'content', 4000)) order by m.id), '[]'::jsonb),
         max(m.id)
    into v_messages, v_last
    from (select h.id, h.message from public.chat_message_history h
           where h.user_id = v_item.user_id and h.session_id = v_item.session_id
             and h.id > coalesce(v_session.summary_covers_until, 0)
             and h.id < coalesce(v_floor, 0)
             and h.message->>'type' <> 'tool'
             and coalesce(jsonb_array_length(h.message->'data'->'tool_calls'), 0) = 0
           order by h.id
           limit p_chunk) m;
  if v_last is null then
    return null;
  end if;
  return jsonb_build_object(
    'summary', v_session.summary,
    'covers_until', v_session.summary_covers_until,
    'messages', v_messages,
    'boundary', v_last);
end
$$;

-- Store a refreshed summary of a leased item covering messages up to
-- p_covers_until, if the session still has the summary it was made from
-- (p_expected: its covers_until then) and still holds that message (a clear
-- in between deleted it). The item stays leased. Returns whether it was stored.
create function memchat.summary_save(
  p_lease uuid, p_summary text, p_covers_until bigint, p_expected bigint
) returns boolean
language plpgsql
security definer
set search_path = ''
as $$
declare
  v_item memchat.summary_queue := memchat.summary_leased(p_lease);
  v_newly integer;
  v_stored uuid;
begin
  if v_item.session_id is null then
    return false;
  end if;
  select count(*) into v_newly from public.chat_message_history h
   where h.user_id = v_item.user_id and h.session_id = v_item.session_id
     and h.id > coalesce(p_expected, 0) and h.id <= p_covers_until;
  update public.chat_sessions s
     set summary = p_summary,
         summary_covers_until = p_covers_until,
         summary_covers_count = s.summary_covers_count + v_newly,
         summary_updated_at = now()
   where s.id = v_item.session_id and s.user_id = v_item.user_id and s.status = 'active'
     and s.summary_covers_until is not distinct from p_expected
     and exists (select 1 from public.chat_message_history h
                  where h.user_id = v_item.user_id and h.session_id = v_item.session_id
                    and h.id = p_covers_until)
  returning s.id into v_stored;
  return v_stored is not null;
end
$$;

-- The end of a leased item's pass: it stays queued (ready now, attempts
-- reset) while p_due_after or more of its messages are outside its summary
-- (new turns meanwhile), else it leaves the queue.
create function memchat.summary_done(p_lease uuid, p_due_after integer) returns void
language plpgsql
security definer
set search_path = ''
as $$
declare
  v_item memchat.summary_queue := memchat.summary_leased(p_lease);
begin
  if v_item.session_id is null then
    return;
  end if;
  if exists (
       select 1 from public.chat_sessions s
        where s.id = v_item.session_id and s.user_id = v_item.user_id and s.status = 'active'
          and s.message_count - s.summary_covers_count >= p_due_after) then
    update memchat.summary_queue q set attempts = 0, next_attempt_at = now(), lease = null
     where q.lease = p_lease;
  else
    delete from memchat.summary_queue q where q.lease = p_lease;
  end if;
end
$$;

-- A leased item's refresh failed: retry in p_retry_in seconds (null: not
-- until the session's next turn queues it again). Returns the failures in a
-- row. A lease is one queue item's (gen_random_uuid() per claimed row).
create function memchat.summary_failed(p_lease uuid, p_retry_in double precision)
returns integer
language plpgsql
security definer
set search_path = ''
as $$
declare
  v_attempts integer;
begin
  update memchat.summary_queue q
     set attempts = q.attempts + 1,
         lease = null,
         next_attempt_at = case when p_retry_in is null then 'infinity'::timestamptz
                                else now() + make_interval(secs => p_retry_in) end
   where q.lease = p_lease and q.next_attempt_at > now()
  returning q.attempts into v_attempts;
  return v_attempts;
end
$$;

-- ======================================================================
-- supabase/schemas/functions/embeddings.sql
-- ======================================================================

-- Embeddings from any OpenAI-compatible provider, of any size, and the
-- backfill that embeds what no turn did (imported messages, `memchat db
-- reembed`) and makes the fact keys (tables/recall_keys.sql).
--
-- * Each stored embedding records the model that made it
--   (OPENAI_EMBEDDING_MODEL); recall compares only embeddings of the model
--   it is asked for, so vectors of different models are never compared.
--   One of no recorded model (stored before models were recorded) is never
--   recalled until `memchat db reembed` embeds its message again (or, with
--   --adopt-unknown, marks it as the configured model's).
-- * The embedding queue (memchat.embedding_queue, tables/queues.sql), like
--   the summary queue: the API's role queues the caller's own sessions
--   (memchat.queue_embeddings, after an import) and reads how many of its
--   messages still wait, and how many the backfill gave up on
--   (memchat.embedding_backlog); the worker (`memchat_worker`) leases
--   queue items and acts only through the SECURITY DEFINER functions below,
--   each naming its lease.
-- * Which messages get an embedding is memchat.embeddable (user messages
--   with text), which of them still need the backfill
--   memchat.unembedded_messages: written once, used by every function here.

-- The stored column's size, for the API's start-up check (and the worker,
-- which embeds nothing that cannot be stored).
create function memchat.embedding_dimensions() returns integer
language plpgsql stable
set search_path = ''
as $$
begin
  return (select a.atttypmod from pg_catalog.pg_attribute a
           where a.attrelid = 'memchat.message_embeddings'::regclass and a.attname = 'embedding');
end
$$;

-- A message that gets an embedding: the user's, with text. Not
-- SECURITY DEFINER and without a search_path of its own, so the planner
-- inlines it into each query (it reads no table and names only built-in
-- operators, which pg_catalog resolves first).
create function memchat.embeddable(p_message jsonb) returns boolean
language sql immutable parallel safe
as $$
  select p_message->>'type' = 'human'
     and jsonb_typeof(p_message->'data'->'content') = 'string'
     and p_message->'data'->>'content' ~ '\S'
$$;

-- A message needs work for p_model (null: its own model) while it has no
-- embedding of that model, or its fact keys are due: it says several things
-- and they were not made with its embedding's model. The embeddable
-- messages of one session that do, the embedding looked up in its owner's
-- partition. Runs as its caller (inlined as well): under RLS for the API's
-- role, as the owner inside the worker's functions.
create function memchat.unembedded_messages(
  p_user_id uuid, p_session_id uuid, p_model text
)
returns setof public.chat_message_history
language sql stable
as $$
  select h.* from public.chat_message_history h
   where h.user_id = p_user_id and h.session_id = p_session_id
     and memchat.embeddable(h.message)
     and not exists (select 1 from memchat.message_embeddings e
                      where e.message_id = h.id and e.user_id = p_user_id
                        and (p_model is null or e.model = p_model)
                        and (e.facts_model is not distinct from e.model
                             or exists (select 1 from memchat.message_facts_made m
                                         where m.message_id = e.message_id
                                           and m.model = e.model)))
$$;

-- Whether a message says several things: a sentence end followed by more
-- (memchat.messages._SENTENCE_END, the same rule). Only such messages get
-- fact keys.
create function memchat.says_several_things(p_text text) returns boolean
language plpgsql immutable parallel safe
set search_path = ''
as $$
begin
  return coalesce(p_text ~ '[.!?][[:space:]]+[A-Z"''(]', false);
end
$$;

-- ------------------------------------------------------- the API's side

-- Queue the caller's own sessions among p_session_ids (others' and unknown
-- ids are ignored) for their messages' embeddings. A session already queued
-- stays as it is, but one given up is ready again. Returns how many of the
-- ids are the caller's sessions. Runs as the caller, under RLS.
create function memchat.queue_embeddings(p_session_ids uuid[]) returns integer
language plpgsql
set search_path = ''
as $$
declare
  v_mine integer;
begin
  with mine as (
    select s.id, s.user_id from public.chat_sessions s
     where s.id = any(p_session_ids) and s.user_id = (select auth.uid())
  ), queued as (
    insert into memchat.embedding_queue as q (session_id, user_id)
    select m.id, m.user_id from mine m
    on conflict (session_id, user_id) do update set attempts = 0, next_attempt_at = now()
     where q.next_attempt_at = 'infinity'
    returning 1
  )
  select count(*)::integer into v_mine from mine;
  return v_mine;
end
$$;

-- The caller's messages without an embedding in its live queued sessions:
-- `pending`, those the backfill will embed (their session waits, is leased
-- or backs off); `failed`, those of sessions it gave up on ('infinity':
-- never embedded until the session is queued again). Both 0: its imports
-- are recallable. Runs as the caller, under RLS.
create function memchat.embedding_backlog(out pending integer, out failed integer)
language plpgsql stable
set search_path = ''
as $$
begin
  select (count(*) filter (where q.next_attempt_at <> 'infinity'))::integer,
         (count(*) filter (where q.next_attempt_at = 'infinity'))::integer
    into pending, failed
    from memchat.embedding_queue q
    join public.chat_sessions s on s.id = q.session_id and s.user_id = q.user_id
    cross join lateral memchat.unembedded_messages(q.user_id, q.session_id, null) u
   where q.user_id = (select auth.uid())
     and s.status = 'active' and s.expires_at > now();
end
$$;

-- ------------------------------------------------------- the worker's side

-- Lease up to p_limit due items for p_lease_seconds (FOR UPDATE SKIP LOCKED:
-- another worker skips them): [{"lease", "session_id", "attempts"}].
create function memchat.embedding_claim(p_limit integer, p_lease_seconds double precision)
returns jsonb
language plpgsql
security definer
set search_path = ''
as $$
declare
  v_leased jsonb;
begin
  with due as (
    select d.session_id, d.user_id from memchat.embedding_queue d
     where d.next_attempt_at <= now()
     order by d.next_attempt_at
     limit p_limit
       for update skip locked
  ), leased as (
    update memchat.embedding_queue q
       set next_attempt_at = now() + make_interval(secs => p_lease_seconds),
           lease = gen_random_uuid()
      from due
     where q.session_id = due.session_id and q.user_id = due.user_id
    returning q.lease, q.session_id, q.attempts
  )
  select coalesce(jsonb_agg(jsonb_build_object(
           'lease', l.lease, 'session_id', l.session_id, 'attempts', l.attempts)), '[]'::jsonb)
    into v_leased
    from leased l;
  return v_leased;
end
$$;

-- The queue item a live lease holds (null: expired, taken over, or never).
create function memchat.embedding_leased(p_lease uuid) returns memchat.embedding_queue
language plpgsql stable security definer
set search_path = ''
as $$
declare
  v_item memchat.embedding_queue;
begin
  select q.* into v_item from memchat.embedding_queue q
   where q.lease = p_lease and q.next_attempt_at > now();
  return v_item;
end
$$;

-- Up to p_limit messages of a leased item's session that need the
-- backfill for p_model, after message p_after, oldest first: [{"id", "text",
-- "embedded"}] ("embedded": it has its embedding of p_model, only its fact
-- keys are missing); [] when none is left, the session is no longer live or
-- the lease is gone.
create function memchat.embedding_source(
  p_lease uuid, p_model text, p_after bigint, p_limit integer
) returns jsonb
language plpgsql stable
security definer
set search_path = ''
as $$
begin
  return (
    select coalesce(jsonb_agg(jsonb_build_object(
             'id', m.id, 'text', m.message->'data'->>'content',
             'embedded', exists (select 1 from memchat.message_embeddings e
                                  where e.message_id = m.id and e.user_id = m.user_id
                                    and e.model = p_model))
             order by m.id), '[]'::jsonb)
      from (select u.id, u.user_id, u.message
              from memchat.embedding_leased(p_lease) q
              join public.chat_sessions s on s.id = q.session_id and s.user_id = q.user_id
             cross join lateral memchat.unembedded_messages(q.user_id, q.session_id, p_model) u
             where s.status = 'active' and s.expires_at > now() and u.id > p_after
             order by u.id
             limit p_limit) m);
end
$$;

-- Store embeddings of p_model: p_embeddings[i] (pgvector's text form: the
-- worker may not use the extensions schema) for message p_ids[i], which
-- must be a message to embed of the session leased by p_leases[i] (a live
-- lease). An embedding of another model (or of none) is replaced; one of
-- p_model (a turn's, stored meanwhile) is kept. Returns how many were stored.
create function memchat.embedding_save(
  p_leases uuid[], p_model text, p_ids bigint[], p_embeddings text[]
) returns integer
language plpgsql
security definer
set search_path = ''
as $$
declare
  v_stored integer;
begin
  with stored as (
    insert into memchat.message_embeddings as e
        (message_id, user_id, session_id, agent_name, created_at, model, embedding)
    select h.id, h.user_id, h.session_id, s.agent_name, h.created_at, p_model,
           x.embedding::extensions.vector
      from unnest(p_leases, p_ids, p_embeddings) as x(lease, id, embedding)
      join memchat.embedding_queue q on q.lease = x.lease and q.next_attempt_at > now()
      join public.chat_message_history h
        on h.id = x.id and h.user_id = q.user_id and h.session_id = q.session_id
      join public.chat_sessions s on s.id = q.session_id and s.user_id = q.user_id
     where memchat.embeddable(h.message) and p_model is not null
    on conflict (message_id, user_id) do update
       set model = excluded.model, embedding = excluded.embedding
     where e.model is distinct from excluded.model
    returning 1
  )
  select count(*)::integer into v_stored from stored;
  return v_stored;
end
$$;

-- Store the fact keys of messages p_done[i] (each of the session leased by
-- p_done_leases[i], with its embedding of p_model stored): their keys of
-- any model are replaced by the given ones (p_ids[j], p_ordinals[j],
-- p_embeddings[j]: pgvector's text form), and each is marked made in
-- memchat.message_facts_made. Returns how many messages were marked.
create function memchat.facts_save(
  p_done_leases uuid[], p_done bigint[], p_model text,
  p_ids bigint[], p_ordinals integer[], p_embeddings text[]
) returns integer
language plpgsql
security definer
set search_path = ''
as $$
declare
  v_done bigint[];
  v_owners uuid[];
  v_marked integer;
begin
  select array_agg(e.message_id), array_agg(distinct e.user_id) into v_done, v_owners
    from unnest(p_done_leases, p_done) as x(lease, id)
    join memchat.embedding_queue q on q.lease = x.lease and q.next_attempt_at > now()
    join memchat.message_embeddings e
      on e.message_id = x.id and e.user_id = q.user_id and e.session_id = q.session_id
   where e.model = p_model;
  if v_done is null then
    return 0;
  end if;
  delete from memchat.message_facts f where f.message_id = any(v_done) and f.user_id = any(v_owners);
  insert into memchat.message_facts
      (message_id, ordinal, user_id, session_id, agent_name, created_at, model, embedding)
  select e.message_id, x.ordinal, e.user_id, e.session_id, e.agent_name, e.created_at, p_model,
         x.embedding::extensions.vector
    from unnest(p_ids, p_ordinals, p_embeddings) as x(id, ordinal, embedding)
    join memchat.message_embeddings e on e.message_id = x.id
   where e.message_id = any(v_done) and e.user_id = any(v_owners);
  insert into memchat.message_facts_made as m (message_id, user_id, model)
  select e.message_id, e.user_id, p_model
    from memchat.message_embeddings e
   where e.message_id = any(v_done) and e.user_id = any(v_owners)
  on conflict (message_id) do update set model = excluded.model;
  get diagnostics v_marked = row_count;
  return v_marked;
end
$$;

-- The end of a leased item's pass: it leaves the queue when none of its
-- session's messages needs an embedding of p_model any more (true), else
-- stays queued, ready now (attempts reset: it made progress, or was cut
-- short). False also when the lease is gone.
create function memchat.embedding_done(p_lease uuid, p_model text) returns boolean
language plpgsql
security definer
set search_path = ''
as $$
declare
  v_item memchat.embedding_queue := memchat.embedding_leased(p_lease);
begin
  if v_item.session_id is null then
    return false;
  end if;
  if exists (
       select 1 from public.chat_sessions s
        cross join lateral memchat.unembedded_messages(s.user_id, s.id, p_model) u
        where s.id = v_item.session_id and s.user_id = v_item.user_id
          and s.status = 'active' and s.expires_at > now()) then
    update memchat.embedding_queue q set attempts = 0, next_attempt_at = now(), lease = null
     where q.lease = p_lease;
    return false;
  end if;
  delete from memchat.embedding_queue q where q.lease = p_lease;
  return true;
end
$$;

-- A leased item's embeddings failed: retry in p_retry_in seconds (null: not
-- until the session is queued again). Returns the failures in a row.
create function memchat.embedding_failed(p_lease uuid, p_retry_in double precision)
returns integer
language plpgsql
security definer
set search_path = ''
as $$
declare
  v_attempts integer;
begin
  update memchat.embedding_queue q
     set attempts = q.attempts + 1,
         lease = null,
         next_attempt_at = case when p_retry_in is null then 'infinity'::timestamptz
                                else now() + make_interval(secs => p_retry_in) end
   where q.lease = p_lease and q.next_attempt_at > now()
  returning q.attempts into v_attempts;
  return v_attempts;
end
$$;

-- Young recall-key partitions analysed, then the common words copied
-- (memchat.copy_word_statistics, functions/words.sql). The worker calls it
-- once at the end of each run (usecases/backfill.py; the summary
-- function's schedule), after its rounds.
--
-- Autovacuum analyses a key partition only after 5,000 + 10% of its rows
-- changed (tables/recall_keys.sql), so a young deployment's partitions go
-- unanalysed until they hold 5,000 keys, and a user with a long history in
-- one of them gets slow searches until then: memchat.rarer_words finds no
-- common words to leave out, and memchat.recall judges the HNSW path
-- without the partition's size (docs/benchmarks.md, "Recall right after a
-- large import"). So every partition (and its memchat.message_facts
-- sibling) is analysed here where it holds at least 1,000 keys and never
-- was, or twice as many keys as its statistics count; those counted 5,000
-- or more are left to autovacuum, at the cost of reading pg_class. Each
-- partition is analysed at most a few times in its life (1,000, 2,000,
-- 4,000 keys...), always by a bulk writer, so cached plans are thrown away
-- rarely. The keys are counted, not read from the cumulative statistics
-- (those lag the worker's last writes); the count stops at the number that
-- decides.
create function memchat.embedding_statistics() returns integer
language plpgsql
security definer
set search_path = ''
as $$
declare
  v_keys pg_catalog.regclass;
  v_counted real;
  v_enough bigint;
  v_present bigint;
  v_analysed integer := 0;
begin
  for v_keys in
    select i.inhrelid::pg_catalog.regclass
      from pg_catalog.pg_inherits i
     where i.inhparent = 'memchat.message_embeddings'::pg_catalog.regclass
     order by 1
  loop
    -- -1: never analysed (nor vacuumed).
    select c.reltuples into v_counted from pg_catalog.pg_class c where c.oid = v_keys;
    continue when v_counted >= 5000;
    v_enough := greatest(2 * v_counted, 1000)::bigint;
    execute pg_catalog.format('select count(*) from (select from %s limit $1) k', v_keys)
       into v_present using v_enough;
    continue when v_present < v_enough;
    execute pg_catalog.format('analyze %s', v_keys);
    -- Its sibling: memchat.message_facts_pNN for memchat.message_embeddings_pNN.
    v_keys := pg_catalog.to_regclass(
      pg_catalog.replace(v_keys::text, 'memchat.message_embeddings_', 'memchat.message_facts_'));
    if v_keys is not null then
      execute pg_catalog.format('analyze %s', v_keys);
    end if;
    v_analysed := v_analysed + 1;
  end loop;
  -- What this run analysed, and what autovacuum did since the last run.
  perform memchat.copy_word_statistics();
  return v_analysed;
end
$$;

-- ======================================================================
-- supabase/schemas/functions/words.sql
-- ======================================================================

-- Recall's word list (memchat.recall, functions/recall.sql): the caller's
-- rounds holding the message's words, best first by ts_rank, found through
-- the GIN index of memchat.message_embeddings.lexemes
-- (tables/recall_keys.sql).
--
-- * A round's lexemes: its user message's (weight A) and its answer's (B),
--   filled when its embedding is stored, by whichever path stores it (a
--   turn, the backfill: trigger message_embeddings_index_round), and its
--   owner's lexeme, so that the GIN index finds one user's rounds: without
--   it the index gives every user's rounds holding a word, and the list's
--   cost grows with the number of users; with it, GIN walks the owner's
--   entry and skips through the words' entries to it.
-- * A long history searches with the message's rarer words only: its
--   commonest, by the statistics of the caller's partition, are left out
--   until the rounds expected to hold one of the rest fit
--   memchat.words_budget(). A common word's matches are many and say little
--   (what BM25's inverse document frequency says too), and ranking them
--   all is most of the list's cost (docs/benchmarks.md).

-- The words of a message as a query matching any of them: the message's
-- lexemes as Postgres indexes text (to_tsvector, English), each quoted for
-- tsquery's input, joined by |. A chat message is not search syntax: read
-- as a web search (websearch_to_tsquery), a hyphenated word became a phrase
-- of the compound and its parts, found only where the same compound is
-- written, and a minus before a word a negation that, ORed with the rest,
-- matched nearly every round. Here a hyphenated word gives the compound and
-- each part, quotes and minus signs are punctuation, "or" is a stop word.
-- Null: no words.
create function memchat.any_words(p_text text) returns tsquery
language plpgsql immutable parallel safe
set search_path = ''
as $$
begin
  return nullif(array_to_string(array(
           select '''' || replace(replace(l.lexeme, '\', '\\'), '''', '''''') || ''''
             from unnest(tsvector_to_array(to_tsvector('english'::regconfig, coalesce(p_text, ''))))
                  as l(lexeme)), ' | '), '')::tsquery;
end
$$;

-- A round's lexemes: the message's (weight A) and its answer's (B).
create function memchat.round_lexemes(p_question text, p_answer text) returns tsvector
language plpgsql immutable parallel safe
set search_path = ''
as $$
begin
  return setweight(to_tsvector('english'::regconfig, coalesce(left(p_question, 8000), '')), 'A')
      || setweight(to_tsvector('english'::regconfig, coalesce(left(p_answer, 8000), '')), 'B');
end
$$;

-- The owner's lexeme: 'user ', a space, and the user id's 32 hex digits. A
-- parser splits words at spaces: no lexeme made from anyone's text, and no
-- query's, holds one, so none matches or ranks it. It is not a guard:
-- memchat.rounds_matching still filters on auth.uid() itself.
create function memchat.owner_lexeme(p_user_id uuid) returns text
language plpgsql immutable parallel safe
set search_path = ''
as $$
begin
  return 'user ' || pg_catalog.replace(p_user_id::text, '-', '');
end
$$;

-- A round's lexemes with its owner's: what message_embeddings.lexemes holds.
create function memchat.owned_lexemes(p_lexemes tsvector, p_user_id uuid)
returns tsvector
language plpgsql immutable parallel safe
set search_path = ''
as $$
begin
  return coalesce(p_lexemes, ''::tsvector)
         operator(pg_catalog.||) pg_catalog.array_to_tsvector(array[memchat.owner_lexeme(p_user_id)]);
end
$$;

-- The trigger that fills a stored embedding's round (trigger
-- message_embeddings_index_round): its lexemes, and whether its fact keys
-- are due (the message says several things: the backfill makes them, its
-- session queued, a given-up one ready again). Runs as whoever inserts the
-- embedding (a turn: the caller, under RLS; the backfill: the owner, in its
-- SECURITY DEFINER functions), with no grant of its own.
create function memchat.index_round() returns trigger
language plpgsql
set search_path = ''
as $$
declare
  v_text text;
begin
  select h.message->'data'->>'content',
         memchat.owned_lexemes(
           memchat.round_lexemes(h.message->'data'->>'content', memchat.answer_of(h.id)),
           new.user_id)
    into v_text, new.lexemes
    from public.chat_message_history h
   where h.id = new.message_id;
  if memchat.says_several_things(v_text) then
    new.facts_model := null;
    -- The backfill adds the fact keys (a given-up session is ready again).
    insert into memchat.embedding_queue as q (session_id, user_id)
    values (new.session_id, new.user_id)
    on conflict (session_id, user_id) do update set attempts = 0, next_attempt_at = now()
     where q.next_attempt_at = 'infinity';
  else
    new.facts_model := new.model;
  end if;
  return new;
end
$$;

-- How many rounds the word list may expect to rank. The list recall fuses
-- is 20 deep; ranking many more rounds to choose those 20 is most of the
-- list's time, and the words a budget leaves out are the message's
-- commonest, whose matches the rarer words' already rank above
-- (docs/benchmarks.md).
create function memchat.words_budget() returns integer
language sql immutable parallel safe
set search_path = ''
as $$ select 100 $$;

-- A history of up to this many rounds keeps every word, whatever the
-- statistics of its partition: its recall does not depend on other users'
-- words or on when autovacuum ran, and ranking it whole costs less than the
-- budget allows for a longer one.
create function memchat.words_whole_rounds() returns integer
language sql immutable parallel safe
set search_path = ''
as $$ select 300 $$;

-- `p_words` without its commonest lexemes, for a caller with `p_rounds`
-- rounds: while the rounds expected to hold one of its lexemes (each
-- lexeme's share of the rows of the caller's partition times p_rounds; a
-- lexeme the statistics do not list counts at the least listed share)
-- exceed p_budget, the commonest goes; the rarest always stays, unless even
-- it alone is expected in more than ten budgets' rounds: then null, no word
-- list (recall ranks by meaning), as a common word's matches cannot tell 20
-- rounds apart. The shares come from the copy of the partition's
-- statistics (memchat.common_words) while it is the latest, else from
-- pg_stats. SECURITY DEFINER: pg_stats shows a table under row-level
-- security only to its owner, and the copy is the owner's; what leaves it
-- is which of the caller's own words are common.
create function memchat.rarer_words(p_words tsquery, p_rounds bigint, p_budget integer)
returns tsquery
language plpgsql stable security definer
set search_path = ''
as $$
declare
  v_name text := memchat.key_partition_name('message_embeddings', auth.uid());
  v_lexemes text[];
  v_shares real[];
  v_elems text[];
  v_listed real[];
  v_floor real;
  v_kept text[] := '{}';
  v_expected double precision := 0;
  v_lexeme record;
begin
  if p_words is null or p_rounds <= greatest(p_budget, memchat.words_whole_rounds()) then
    return p_words;
  end if;
  -- Each lexeme as the statistics spell it (tsquery's input doubles quotes).
  v_lexemes := array(select distinct l[1] from pg_catalog.regexp_matches(p_words::text, '''((?:[^'']|'''')+)''', 'g') l);
  select w.floor into v_floor
    from memchat.word_statistics w
   where w.partition_name = v_name
     and w.analysed_at >= memchat.last_analysed(pg_catalog.to_regclass('memchat.' || v_name));
  if found then
    -- The copy is the partition's latest statistics: its lexemes by key.
    v_shares := array(
      select coalesce(c.share, v_floor)
        from unnest(v_lexemes) with ordinality q(lexeme, n)
        left join memchat.common_words c
          on c.partition_name = v_name and c.lexeme = replace(q.lexeme, '''''', '''')
       order by q.n);
  else
    select s.most_common_elems::text::text[], s.most_common_elem_freqs
      into v_elems, v_listed
      from pg_catalog.pg_stats s
     where s.schemaname = 'memchat'
       and s.tablename = v_name
       and s.attname = 'lexemes';
    if v_elems is null then
      return p_words;  -- not analysed yet: every word
    end if;
    -- most_common_elem_freqs ends with the least and greatest listed share
    -- and the share of nulls.
    v_floor := v_listed[cardinality(v_elems) + 1];
    v_shares := array(
      select coalesce(f.share, v_floor)
        from unnest(v_lexemes) with ordinality q(lexeme, n)
        left join unnest(v_elems, v_listed[1:cardinality(v_elems)]) f(lexeme, share)
          on f.lexeme = replace(q.lexeme, '''''', '''')
       order by q.n);
  end if;
  for v_lexeme in
    select q.lexeme, q.share from unnest(v_lexemes, v_shares) q(lexeme, share) order by 2, 1
  loop
    exit when cardinality(v_kept) > 0 and v_expected + v_lexeme.share * p_rounds > p_budget;
    v_kept := v_kept || v_lexeme.lexeme;
    v_expected := v_expected + v_lexeme.share * p_rounds;
  end loop;
  if v_expected > 10 * p_budget then
    return null;  -- only the rarest word is kept, and it is common: no words
  end if;
  if cardinality(v_kept) = cardinality(v_lexemes) then
    return p_words;
  end if;
  return (select string_agg('''' || k || '''', ' | ') from unnest(v_kept) k)::tsquery;
end
$$;

-- A partition's last analysis as the cumulative statistics know it
-- (-infinity: none known, e.g. after they were reset).
create function memchat.last_analysed(p_partition regclass)
returns timestamptz
language plpgsql stable
set search_path = ''
as $$
begin
  return coalesce(greatest(pg_catalog.pg_stat_get_last_analyze_time(p_partition),
                           pg_catalog.pg_stat_get_last_autoanalyze_time(p_partition)),
                  '-infinity');
end
$$;

-- Copy the statistics of every recall-key partition analysed since its
-- copy (or never copied) into memchat.word_statistics and
-- memchat.common_words (tables/recall_keys.sql). The analysis time is read
-- before the statistics: an analysis that lands in between leaves the copy
-- older than the partition's last analysis, so it is not used, and the next
-- run copies again. Returns how many partitions were copied. Called by
-- memchat.embedding_statistics (functions/embeddings.sql).
create function memchat.copy_word_statistics() returns integer
language plpgsql
security definer
set search_path = ''
as $$
declare
  v_part record;
  v_at timestamptz;
  v_elems text[];
  v_shares real[];
  v_copied integer := 0;
begin
  for v_part in
    select i.inhrelid::pg_catalog.regclass as oid, c.relname::text as name, w.analysed_at
      from pg_catalog.pg_inherits i
      join pg_catalog.pg_class c on c.oid = i.inhrelid
      left join memchat.word_statistics w on w.partition_name = c.relname::text
     where i.inhparent = 'memchat.message_embeddings'::pg_catalog.regclass
     order by 2
  loop
    v_at := memchat.last_analysed(v_part.oid);
    -- Copied since its last analysis, or never analysed that we know of.
    continue when v_part.analysed_at >= v_at
               or (v_part.analysed_at is null and v_at = '-infinity');
    select s.most_common_elems::text::text[], s.most_common_elem_freqs
      into v_elems, v_shares
      from pg_catalog.pg_stats s
     where s.schemaname = 'memchat' and s.tablename = v_part.name and s.attname = 'lexemes';
    delete from memchat.word_statistics w where w.partition_name = v_part.name;
    if v_elems is not null then
      v_copied := v_copied + 1;
      -- most_common_elem_freqs ends with the least and greatest listed
      -- share and the share of nulls.
      insert into memchat.word_statistics (partition_name, analysed_at, floor)
      values (v_part.name, v_at, v_shares[cardinality(v_elems) + 1]);
      insert into memchat.common_words (partition_name, lexeme, share)
      select v_part.name, e.lexeme, e.share
        from unnest(v_elems, v_shares[1:cardinality(v_elems)]) e(lexeme, share);
    end if;
  end loop;
  return v_copied;
end
$$;

-- From how many rounds the word list is planned for its words: the owner
-- index's entries a generic plan may read grow with the history, a plan of
-- its own costs a planning.
create function memchat.words_planned_from() returns integer
language sql immutable parallel safe
set search_path = ''
as $$ select 2000 $$;

-- The owner's rounds of one agent and model in live sessions, outside the
-- window (message ids from p_floor on, in p_session_id), whose lexemes
-- match p_owned (the owner's lexeme and p_words), best first by their rank
-- for p_words (ts_rank normalised by the round's length: 1 + log). PL/pgSQL,
-- whose statements are planned through the plan cache on every PostgreSQL
-- version (before 18 a SQL function's statements are planned at every call,
-- and without their parameters' values), with the call's values when a
-- plan of its own is made. p_planned chooses: a plan for this call's words
-- and caller, with the caller's partition pruned while planning, for a long
-- history (a generic plan ANDs the words' GIN index with the owner index
-- and reads every one of the caller's entries from the latter), else the
-- connection's cached generic plan, made once. Bitmap scans on: the GIN
-- index is read through one. Not executable by users: it trusts p_user_id.
create function memchat.owned_rounds_matching(
  p_user_id uuid, p_agent_name text, p_model text, p_words tsquery, p_owned tsquery,
  p_session_id uuid, p_floor bigint, p_limit integer, p_planned boolean
) returns bigint[]
language plpgsql stable
set search_path = ''
set enable_bitmapscan = on
-- Restored when the function returns; set below for the one statement.
set plan_cache_mode = force_generic_plan
as $$
begin
  perform pg_catalog.set_config(
    'plan_cache_mode',
    case when p_planned then 'force_custom_plan' else 'force_generic_plan' end,
    true);
  return (
    select coalesce(array_agg(m.message_id order by m.rank desc, m.message_id desc), '{}')
      from (select e.message_id, ts_rank(e.lexemes, p_words, 1) as rank
              from memchat.message_embeddings e
              join public.chat_sessions s on s.id = e.session_id and s.user_id = e.user_id
             where e.user_id = p_user_id and e.agent_name = p_agent_name and e.model = p_model
               and s.status = 'active' and s.expires_at > pg_catalog.now()
               and (p_session_id is null or e.session_id <> p_session_id or e.message_id < p_floor)
               and e.lexemes operator(pg_catalog.@@) p_owned
             order by 2 desc, 1 desc
             limit p_limit) m);
end
$$;

-- The caller's rounds holding a word of p_words (memchat.owned_rounds_matching
-- for the verified claims' auth.uid(); none without claims), the plan chosen
-- by the history's length (p_rounds). SECURITY DEFINER, so that the GIN
-- index can be used: under row-level security the planner may not use it
-- for `@@` (ts_match_vq is not leakproof, so it cannot run before the
-- policy's filter), and every one of the caller's rows was read and tested.
-- Nested loops off: the sessions are hashed, where a generic plan expecting
-- the average user's one session would read the caller's keys once per
-- session.
create function memchat.rounds_matching(
  p_agent_name text, p_model text, p_words tsquery, p_session_id uuid, p_floor bigint,
  p_limit integer, p_rounds bigint
) returns bigint[]
language plpgsql stable security definer
set search_path = ''
set enable_nestloop = off
as $$
begin
  -- Without a user (claims without `sub`) both are null: no row matches.
  return memchat.owned_rounds_matching(
           auth.uid(), p_agent_name, p_model, p_words,
           pg_catalog.quote_literal(memchat.owner_lexeme(auth.uid()))::tsquery
             operator(pg_catalog.&&) p_words,
           p_session_id, p_floor, p_limit, p_rounds > memchat.words_planned_from());
end
$$;

-- ======================================================================
-- supabase/schemas/functions/recall.sql
-- ======================================================================

-- Recall across conversations: a new message's embedding (and its words)
-- find the caller's earlier exchanges, under row-level security. The keys
-- it searches: tables/recall_keys.sql; the word list: functions/words.sql.
--
-- Every function here that memchat.recall's statements call from FROM is
-- plain SQL with no SET clause, so that the planner inlines it; the others
-- are PL/pgSQL, whose statements are planned once per connection on every
-- PostgreSQL version (before 18, a SQL function the planner does not inline
-- is parsed and planned again each time the statement calling it runs; a
-- function with a SET clause or SECURITY DEFINER is never inlined). The
-- rule holds for every function (tests/store/test_plans.py).

-- ------------------------------------------------------- the keys

-- The caller's recall keys of one agent and model in live sessions, outside
-- the window (message ids from p_floor on, in p_session_id): each message's
-- embedding and its fact keys. Inlined into memchat.recall's statements,
-- running with its caller's rights.
create function memchat.recall_keys(
  p_uid uuid, p_agent_name text, p_model text, p_session_id uuid, p_floor bigint
) returns table (message_id bigint, created_at timestamptz, embedding extensions.vector)
language sql stable
as $$
  select e.message_id, e.created_at, e.embedding
    from memchat.message_embeddings e
    join public.chat_sessions s on s.id = e.session_id and s.user_id = e.user_id
   where e.user_id = p_uid and e.agent_name = p_agent_name and e.model = p_model
     and s.status = 'active' and s.expires_at > pg_catalog.now()
     and (p_session_id is null or e.session_id <> p_session_id or e.message_id < p_floor)
  union all
  select f.message_id, f.created_at, f.embedding
    from memchat.message_facts f
    join public.chat_sessions s on s.id = f.session_id and s.user_id = f.user_id
   where f.user_id = p_uid and f.agent_name = p_agent_name and f.model = p_model
     and s.status = 'active' and s.expires_at > pg_catalog.now()
     and (p_session_id is null or f.session_id <> p_session_id or f.message_id < p_floor)
$$;

-- The exact scan: the caller's p_depth messages nearest to p_query (a
-- message as near as its nearest key, memchat.recall_keys), written in
-- [p_from, p_until) (null: open), best first. Inlined into memchat.recall's
-- statements with its caller's rights: the owner indexes read in order
-- (bitmap scans off there).
create function memchat.nearest_messages(
  p_uid uuid, p_agent_name text, p_model text, p_session_id uuid, p_floor bigint,
  p_query extensions.vector, p_depth integer, p_from timestamptz, p_until timestamptz
) returns table (message_id bigint)
language sql stable
as $$
  select k.message_id
    from (select k.message_id, k.embedding operator(extensions.<=>) p_query as distance
            from memchat.recall_keys(p_uid, p_agent_name, p_model, p_session_id, p_floor) k
           where k.created_at >= coalesce(p_from, '-infinity')
             and k.created_at < coalesce(p_until, 'infinity')
           order by distance
           limit p_depth * 3) k
   group by k.message_id
   order by min(k.distance), k.message_id desc
   limit p_depth
$$;

-- Whether the installed pgvector has iterative index scans (0.8.0+).
-- Without them (0.6 in pgserver 0.1.4) a filtered HNSW search returns fewer
-- rows than exist: only the exact scan is correct.
create function memchat.vector_iterative_scans() returns boolean
language plpgsql stable parallel safe
set search_path = ''
as $$
begin
  return coalesce((
    select pg_catalog.string_to_array(pg_catalog.split_part(e.extversion, '-', 1), '.')::int[]
           >= array[0, 8]
      from pg_catalog.pg_extension e
     where e.extname = 'vector'), false);
end
$$;

-- The most dimensions halfvec's HNSW indexes take (pgvector 0.7+; vector's
-- take 2,000): a 3,072-dimension model (text-embedding-3-large) has the
-- index path too.
create function memchat.hnsw_max_dimensions() returns integer
language sql immutable parallel safe
set search_path = ''
as $$ select 4000 $$;

-- From how many messages in live sessions (user and assistant: the
-- sessions' message_count) a caller's nearest keys come from the HNSW
-- indexes. Below it the exact scan is cheap (about 1,000 keys) and exact; a
-- caller with few rows in a big table is also where a filtered index scan
-- works hardest for what it finds.
create function memchat.ann_from_messages() returns integer
language sql immutable parallel safe
set search_path = ''
as $$ select 2000 $$;

-- The HNSW scans' candidate list (hnsw.ef_search), sized to the graph they
-- walk, the caller's partition's: how closely an HNSW scan follows the
-- exact order at a given ef_search falls as the graph grows. A partition of
-- fewer than 15,000 rows is searched with 48 candidates (the same hits as
-- with more), a larger one, or one never analysed (its size unknown), with
-- 100 (docs/benchmarks.md). The partition holds at least its caller's
-- rounds, whatever its statistics (made while it was smaller, e.g. 0 when
-- its indexes were built empty) say.
create function memchat.recall_ef_search(p_partition_rows real, p_rounds bigint)
returns integer
language plpgsql immutable parallel safe
set search_path = ''
as $$
begin
  return case when p_partition_rows >= 0 and greatest(p_partition_rows, p_rounds) < 15000
              then 48 else 100 end;
end
$$;

-- The HNSW indexes over the recall keys, where pgvector has iterative scans
-- and the column's size allows, and the statement that reads them
-- (memchat.nearest_keys_indexed), written for that size; otherwise no
-- indexes (the exact scan). Returns whether the indexes are there.
-- * The indexes hold the keys cast to halfvec, 2 bytes a dimension: half
--   the size, so that twice as much of them stays in shared_buffers
--   (docs/benchmarks.md). Only the order of the scan is in half precision:
--   each key's distance is computed from its stored vector, and the
--   candidates are ranked by that.
-- * An index over an expression is used by a query naming the same
--   expression, and a halfvec's size is part of it: hence
--   memchat.nearest_keys_indexed is written here (EXECUTE) for the column's
--   size, and an index of another size or kind is made again.
-- Run below, and after a change of the column's size (`memchat db reembed
-- --dimensions`: store.resize_embeddings, as the owner), which drops the
-- indexes first. memchat.nearest_keys_indexed: the caller's p_limit keys
-- nearest to p_query of each kind (a message's own embedding, its fact
-- keys), through the indexes, each scan going on until it has its rows of
-- the caller's (hnsw.iterative_scan, set by memchat.recall), ordered in half
-- precision, each with its distance from the stored vector; under the
-- caller's rights (row-level security), its plans generic (the partitions
-- pruned when a plan starts).
create function memchat.index_recall_keys() returns boolean
language plpgsql
set search_path = ''
as $$
declare
  v_dimensions integer := memchat.embedding_dimensions();
  v_wanted boolean := memchat.vector_iterative_scans()
                      and v_dimensions <= memchat.hnsw_max_dimensions();
  v_half text := pg_catalog.format('extensions.halfvec(%s)', v_dimensions);
  v_table text;
  v_index text;
begin
  foreach v_table in array array['message_embeddings', 'message_facts'] loop
    v_index := v_table || '_embedding_idx';
    if pg_catalog.to_regclass('memchat.' || v_index) is not null
       and (not v_wanted
            or pg_catalog.strpos(pg_catalog.pg_get_indexdef(('memchat.' || v_index)::regclass),
                                 v_half) = 0) then
      execute pg_catalog.format('drop index memchat.%I', v_index);
    end if;
    if v_wanted then
      execute pg_catalog.format(
        'create index if not exists %I on memchat.%I'
        ' using hnsw ((embedding::%s) extensions.halfvec_cosine_ops)',
        v_index, v_table, v_half);
    end if;
  end loop;
  if not v_wanted then
    return false;
  end if;
  -- The caller's p_limit keys nearest to p_query of each kind (a message's
  -- own embedding, its fact keys), through the indexes: each scan going on
  -- until it has its rows of the caller's (hnsw.iterative_scan, set by
  -- memchat.recall), ordered in half precision, each with its distance from
  -- the stored vector. Under the caller's rights (row-level security).
  execute pg_catalog.format($f$
    create or replace function memchat.nearest_keys_indexed(
      p_uid uuid, p_agent_name text, p_model text, p_query extensions.vector, p_limit integer
    ) returns table (message_id bigint, session_id uuid, distance double precision)
    language plpgsql stable
    set search_path = ''
    set plan_cache_mode = force_generic_plan
    as $b$
    declare
      v_query %1$s := p_query::%1$s;
    begin
      return query
        (select e.message_id, e.session_id, e.embedding operator(extensions.<=>) p_query
           from memchat.message_embeddings e
          where e.user_id = p_uid and e.agent_name = p_agent_name and e.model = p_model
          order by (e.embedding::%1$s) operator(extensions.<=>) v_query
          limit p_limit)
        union all
        (select f.message_id, f.session_id, f.embedding operator(extensions.<=>) p_query
           from memchat.message_facts f
          where f.user_id = p_uid and f.agent_name = p_agent_name and f.model = p_model
          order by (f.embedding::%1$s) operator(extensions.<=>) v_query
          limit p_limit);
    end
    $b$ $f$, v_half);
  revoke all on function memchat.nearest_keys_indexed(uuid, text, text, extensions.vector, integer)
    from public;
  grant execute on function
    memchat.nearest_keys_indexed(uuid, text, text, extensions.vector, integer) to memchat_user;
  return true;
end
$$;

-- The index path is there: iterative scans, both indexes, and the statement
-- reading them.
create function memchat.recall_index_ready() returns boolean
language plpgsql stable
set search_path = ''
as $$
begin
  return memchat.vector_iterative_scans()
     and pg_catalog.to_regclass('memchat.message_embeddings_embedding_idx') is not null
     and pg_catalog.to_regclass('memchat.message_facts_embedding_idx') is not null
     and pg_catalog.to_regprocedure(
           'memchat.nearest_keys_indexed(uuid, text, text, extensions.vector, integer)') is not null;
end
$$;

-- ------------------------------------------------------- the hits

-- The first assistant message after p_message_id in its session that is not
-- a tool call: its text. Not SECURITY DEFINER and without a search_path of
-- its own, so the planner inlines it where it is read in FROM (it names
-- only built-in operators and functions, which pg_catalog resolves first):
-- memchat.recall_hits reads every answer in its one statement. Under the
-- caller's rights.
create function memchat.answer_after(p_user_id uuid, p_session_id uuid, p_message_id bigint)
returns table (content text)
language sql stable
as $$
  select x.message->'data'->>'content'
    from public.chat_message_history x
   where x.user_id = p_user_id and x.session_id = p_session_id and x.id > p_message_id
     and x.message->>'type' = 'ai'
     and coalesce(pg_catalog.jsonb_array_length(x.message->'data'->'tool_calls'), 0) = 0
   order by x.id
   limit 1
$$;

-- The same as a value, for memchat.index_round (functions/words.sql).
create function memchat.answer_of(p_message_id bigint) returns text
language plpgsql stable
set search_path = ''
as $$
begin
  return (
    select a.content
      from public.chat_message_history h
      cross join lateral memchat.answer_after(h.user_id, h.session_id, h.id) a
     where h.id = p_message_id);
end
$$;

-- What the caller reads of recall's hits, from the ids (and scores) it
-- chose, best first: [{message_id, session_id, created_at, score, title,
-- question, answer, before, after}]. `before` is the exchange before the
-- hit in its session (what the hit often answers or goes on from), `after`
-- the exchange after it (what often answers or corrects it: "actually, it
-- was Tuesday"), each cut to 1,000 characters; in the turn's session
-- (p_session_id, its window from message p_floor on) the exchange after a
-- hit is never one of the window's, which the prompt shows already. Runs as
-- the caller (under RLS): for ids that are not the caller's it returns
-- nothing. A function of its own, so that a change to what a hit carries
-- replaces it alone, not the ranking.
create function memchat.recall_hits(
  p_ids bigint[],
  p_scores double precision[],
  p_session_id uuid,
  p_floor bigint
) returns jsonb
language plpgsql stable
set search_path = ''
as $$
begin
  return coalesce((
    select jsonb_agg(jsonb_build_object(
             'message_id', h.id,
             'session_id', h.session_id,
             'created_at', h.created_at,
             'score', hit.score,
             'title', s.title,
             'question', left(h.message->'data'->>'content', 2000),
             'answer', left(ha.content, 2000),
             'before', case when b.id is not null then jsonb_build_object(
               'message_id', b.id,
               'question', left(b.message->'data'->>'content', 1000),
               'answer', left(ba.content, 1000)) end,
             'after', case when a.id is not null then jsonb_build_object(
               'message_id', a.id,
               'question', left(a.message->'data'->>'content', 1000),
               'answer', left(aa.content, 1000)) end)
           order by hit.ord)
      from unnest(p_ids, p_scores) with ordinality as hit(id, score, ord)
      join public.chat_message_history h on h.id = hit.id
      join public.chat_sessions s on s.id = h.session_id and s.user_id = h.user_id
      left join lateral memchat.answer_after(h.user_id, h.session_id, h.id) ha on true
      -- The exchange before it in its session (its neighbour): what the hit
      -- often answers or goes on from.
      left join lateral (
           select x.id, x.message from public.chat_message_history x
            where x.user_id = h.user_id and x.session_id = h.session_id and x.id < h.id
              and memchat.embeddable(x.message)
            order by x.id desc limit 1) b on true
      left join lateral memchat.answer_after(h.user_id, h.session_id, b.id) ba on true
      -- The exchange after it: what often answers or corrects it. In the
      -- turn's session, not one of the window's (the prompt shows those).
      left join lateral (
           select x.id, x.message from public.chat_message_history x
            where x.user_id = h.user_id and x.session_id = h.session_id and x.id > h.id
              and (p_session_id is null or x.session_id <> p_session_id or x.id < p_floor)
              and memchat.embeddable(x.message)
            order by x.id limit 1) a on true
      left join lateral memchat.answer_after(h.user_id, h.session_id, a.id) aa on true),
    '[]'::jsonb);
end
$$;

-- ------------------------------------------------------- recall

-- The caller's earlier user messages of one agent and model (p_model: the
-- query's embedding model; those of another are never compared) most like
-- the turn's message (p_query, its embedding; p_text, its text), at most
-- p_k, best first, as memchat.recall_hits gives them: in live sessions only
-- (not expired; cleared ones have no messages left), never the last
-- p_window conversational messages of p_session_id (the turn's session;
-- null: the active one, if any), none below p_min_score (the similarity to
-- the nearest of the message's keys, however it was found: an operator's
-- floor holds), and none at p_collapse similarity or more to a better hit
-- (near-duplicates collapse into the best one). Runs as the caller: RLS
-- applies to every read.
--
-- Three candidate lists, each its own statement, fused by reciprocal rank:
-- * by meaning, the nearest keys: a long history (memchat.ann_from_messages()
--   messages or more, and a share of its partition large enough that a
--   filtered scan visits well under the caller's own rows) through the
--   HNSW indexes of the caller's partition (memchat.nearest_keys_indexed),
--   each scan going on until it has its rows of the caller's; if that yields
--   fewer than k (many of the nearest in expired sessions, or the scans'
--   tuple limit reached), or for a shorter history, or without iterative
--   scans, the exact scan (memchat.nearest_messages), the owner index read
--   in order;
-- * by words (memchat.rounds_matching, with memchat.rarer_words' words);
-- * when a period [p_from, p_until) is given (a time expression in the
--   message, read by the API), the nearest by meaning within it.
-- The k best are then picked, each candidate's fused score worth 0.9 times
-- less for every hit already taken from its session: several sessions that
-- each say something come before one session saying it again (a question
-- about "how many", "which first" needs them all). The candidates are read
-- through a cursor, best fused first, each one's similarity computed as it
-- is fetched, and a pick is taken as soon as no later candidate can change
-- it.
--
-- Its settings:
-- * enable_bitmapscan = off: an ordered scan of the owner index beats a
--   bitmap scan of the same rows; the planner, blind behind RLS to how many
--   rows one user has, expects few and picks the bitmap scan.
-- * plan_cache_mode = force_generic_plan: the partitions are pruned when a
--   plan starts. A plan made for each call's values prunes them while
--   planning, but planning over the partitioned tables costs more than it
--   saves, and the plan cache, seeing a generic plan's cost summed over all
--   32 partitions, would never switch to one.
-- * Sorting and sequential scans are off while the HNSW statement is
--   planned (so that the planner cannot read the owner index and sort
--   instead, the exact scan's cost), nested loops while the exact scans are
--   (the caller's live sessions are hashed, where a generic plan expecting
--   the average user's one session would read the caller's keys once per
--   session).
create function memchat.recall(
  p_session_id uuid,
  p_agent_name text,
  p_window integer,
  p_query extensions.vector,
  p_model text,
  p_text text,
  p_k integer,
  p_min_score double precision,
  p_collapse double precision,
  p_from timestamptz,
  p_until timestamptz
) returns jsonb
language plpgsql stable
set search_path = ''
set enable_bitmapscan = off
set enable_sort = on
set enable_nestloop = on
set plan_cache_mode = force_generic_plan
as $$
declare
  v_uid uuid := auth.uid();
  v_floor bigint := 9223372036854775807;
  v_words tsquery := memchat.any_words(p_text);
  v_depth integer := greatest(p_k * 2, 20);
  v_messages bigint := 0;
  v_table_rows real;
  v_meaning bigint[] := '{}';
  v_matching bigint[] := '{}';
  v_period bigint[] := '{}';
  v_kept extensions.vector[] := '{}';
  v_ids bigint[] := '{}';
  v_scores double precision[] := '{}';
  v_candidate record;
  -- The candidates left after the floor and the collapse, best fused first.
  v_pool_ids bigint[] := '{}';
  v_pool_fused double precision[] := '{}';
  v_pool_scores double precision[] := '{}';
  v_pool_sessions uuid[] := '{}';
  v_sessions uuid[] := '{}';
  v_best integer;
  v_best_value double precision;
  v_value double precision;
  v_bound double precision;
  v_cursor refcursor;
begin
  if p_k <= 0 then
    return '[]'::jsonb;
  end if;
  if p_session_id is null then
    -- The turn's session, resolved as load_context resolves it.
    select s.id into p_session_id
      from public.user_agent_active_sessions a
      join public.chat_sessions s on s.id = a.active_session_id and s.user_id = a.user_id
     where a.user_id = v_uid and a.agent_name = p_agent_name
       and s.status = 'active' and s.expires_at > now();
  end if;
  if p_session_id is not null and p_window > 0 then
    select coalesce(min(w.id), v_floor) into v_floor
      from (select h.id from public.chat_message_history h
             where h.user_id = v_uid and h.session_id = p_session_id
               and h.message->>'type' <> 'tool'
               and coalesce(jsonb_array_length(h.message->'data'->'tool_calls'), 0) = 0
             order by h.id desc
             limit p_window) w;
  end if;
  -- The history's length, from the sessions' counters (one row per session).
  select coalesce(sum(s.message_count), 0) into v_messages
    from public.chat_sessions s
   where s.user_id = v_uid and s.agent_name = p_agent_name
     and s.status = 'active' and s.expires_at > now();

  -- A message is as near as its nearest key (its own embedding or a fact's).
  if v_messages >= memchat.ann_from_messages() and memchat.recall_index_ready() then
    -- The rows of the caller's partition as the statistics know them (-1:
    -- never analysed): the HNSW scan runs in that partition's index only.
    select c.reltuples into v_table_rows
      from pg_catalog.pg_class c
     where c.oid = memchat.key_partition_of('message_embeddings', v_uid);
  end if;
  if v_table_rows is not null
     and (v_table_rows < 0
          or (v_messages / 2.0) ^ 2 > 4.0 * (v_depth * 3 + p_window) * v_table_rows) then
    -- The HNSW indexes, each scan going on until it has its rows of the
    -- caller's (relaxed order: re-sorted here). Sorting is off while the
    -- statements are planned (memchat.nearest_keys_indexed's too), so that
    -- the planner cannot read the owner index and sort instead, which is
    -- the exact scan's cost.
    perform set_config('hnsw.iterative_scan', 'relaxed_order', true),
            set_config('hnsw.ef_search',
                       memchat.recall_ef_search(v_table_rows, v_messages / 2)::text, true),
            set_config('enable_sort', 'off', true),
            set_config('enable_seqscan', 'off', true);
    v_meaning := array(
      select n.message_id
        from memchat.nearest_keys_indexed(v_uid, p_agent_name, p_model, p_query,
                                          v_depth + p_window) n
        join public.chat_sessions s on s.id = n.session_id and s.user_id = v_uid
       where s.status = 'active' and s.expires_at > pg_catalog.now()
         and (p_session_id is null or n.session_id <> p_session_id or n.message_id < v_floor)
       group by n.message_id
       order by min(n.distance), n.message_id desc
       limit v_depth);
    perform set_config('enable_sort', 'on', true),
            set_config('enable_seqscan', 'on', true),
            set_config('hnsw.iterative_scan', 'off', true);
  end if;
  -- The exact scans hash the caller's live sessions (above): no nested
  -- loop that reads the caller's keys once per session.
  perform set_config('enable_nestloop', 'off', true);
  -- Fewer than k from the indexes (the scans stopped at
  -- hnsw.max_scan_tuples before finding the caller's rows): the exact scan.
  -- Fewer than the list's depth but k or more (the nearest keys belong to
  -- fewer messages) is a shorter list, not a reason to read every row.
  if cardinality(v_meaning) < least(v_depth, p_k) then
    -- The exact scan: the owner index read in order (bitmap scans off,
    -- this function's setting).
    v_meaning := array(select n.message_id from memchat.nearest_messages(
      v_uid, p_agent_name, p_model, p_session_id, v_floor, p_query, v_depth, null, null) n);
  end if;
  if p_from is not null or p_until is not null then
    v_period := array(select n.message_id from memchat.nearest_messages(
      v_uid, p_agent_name, p_model, p_session_id, v_floor, p_query, v_depth, p_from, p_until) n);
  end if;
  perform set_config('enable_nestloop', 'on', true);
  if v_words is not null then
    v_words := memchat.rarer_words(v_words, v_messages / 2, memchat.words_budget());
    v_matching := memchat.rounds_matching(p_agent_name, p_model, v_words, p_session_id, v_floor,
                                          v_depth, v_messages / 2);
  end if;

  -- Reciprocal rank fusion with k = 20: the lists' first places weigh more
  -- than with the customary 60, so that an exchange first by meaning and
  -- first in the period is not outranked by one that is middling in all
  -- three lists (measured on LongMemEval, docs/benchmarks.md). The
  -- candidates come best fused first, each with its similarity to the query
  -- (its own embedding's or its nearest fact key's) computed as it is
  -- fetched.
  open v_cursor for
    select f.id as message_id, f.fused::double precision as fused, e.session_id, e.embedding,
           e.score
      from (select l.id, sum(1.0 / (20 + l.r)) as fused
              from (select * from unnest(v_meaning) with ordinality as a(id, r)
                    union all select * from unnest(v_matching) with ordinality as b(id, r)
                    union all select * from unnest(v_period) with ordinality as c(id, r)) l
             group by l.id
             order by 2 desc, 1 desc) f
      cross join lateral (
        select x.session_id, x.embedding,
               1 - least(x.embedding operator(extensions.<=>) p_query,
                         (select min(k.embedding operator(extensions.<=>) p_query)
                            from memchat.message_facts k
                           where k.message_id = f.id and k.user_id = v_uid
                             and k.model = p_model)) as score
          from memchat.message_embeddings x
         where x.message_id = f.id and x.user_id = v_uid
        offset 0) e
     order by f.fused desc, f.id desc;
  loop
    fetch v_cursor into v_candidate;
    -- No later candidate is worth more than its fused score.
    v_bound := case when found then v_candidate.fused else -1 end;
    -- The k best, each candidate's fused score worth 0.9 times less for
    -- every hit already taken from its session: several sessions that each
    -- say something come before one session saying it again (a question
    -- about "how many", "which first" needs them all), while a session
    -- holding several good exchanges still gives them. A pick is taken once
    -- no later candidate can change it: the pool's best value is at least
    -- the bound (a later candidate would lose the tie).
    loop
      exit when cardinality(v_ids) >= p_k;
      v_best := null;
      v_best_value := -1;
      for i in 1 .. coalesce(cardinality(v_pool_ids), 0) loop
        continue when v_pool_ids[i] = any(v_ids);
        v_value := v_pool_fused[i]
                   * 0.9 ^ coalesce(cardinality(array_positions(v_sessions, v_pool_sessions[i])), 0);
        if v_value > v_best_value then
          v_best := i;
          v_best_value := v_value;
        end if;
      end loop;
      exit when v_best is null or v_best_value < v_bound;
      v_ids := v_ids || v_pool_ids[v_best];
      v_scores := v_scores || v_pool_scores[v_best];
      v_sessions := v_sessions || v_pool_sessions[v_best];
    end loop;
    exit when v_bound < 0 or cardinality(v_ids) >= p_k;
    -- Into the pool: above the floor, and not the same memory as one kept.
    continue when v_candidate.score < p_min_score;
    continue when exists (
      select 1 from unnest(v_kept) k(v)
       where 1 - (k.v operator(extensions.<=>) v_candidate.embedding) >= p_collapse);
    v_kept := v_kept || v_candidate.embedding;
    v_pool_ids := v_pool_ids || v_candidate.message_id;
    v_pool_fused := v_pool_fused || v_candidate.fused;
    v_pool_scores := v_pool_scores || v_candidate.score;
    v_pool_sessions := v_pool_sessions || v_candidate.session_id;
  end loop;
  close v_cursor;

  return memchat.recall_hits(v_ids, v_scores, p_session_id, v_floor);
end
$$;

-- The HNSW indexes and memchat.nearest_keys_indexed, for this server's
-- pgvector and the column's size.
select memchat.index_recall_keys();

-- ======================================================================
-- supabase/schemas/functions/cleanup.sql
-- ======================================================================

-- What goes with a deleted message: its embedding, fact keys and their
-- marker, and its feedback (tables/recall_keys.sql, tables/feedback.sql),
-- a statement at a time, for every deleter: clear-session, DELETE /me and
-- the TTL cleanup (through the session cascade), LangChain's clear(), the
-- Data API. The triggers: triggers.sql.
--
-- Foreign keys would do it a row at a time: every message deleted would run
-- one more query per referencing table, found something or not, and the TTL
-- cleanup deletes messages by the hundred thousand (docs/benchmarks.md,
-- "Scheduled cleanup"). What replaces them keeps what the foreign keys
-- promised:
-- * Deletes: a statement-level trigger on chat_message_history (its deleted
--   rows as a transition table) deletes what belonged to them. Like a
--   foreign key's cascade it runs as the tables' owner (security definer,
--   fixed search_path): it deletes only what belongs to messages the caller
--   was allowed to delete.
-- * Truncate: truncating chat_message_history truncates them too.
-- * Inserts (and a changed message_id): a row-level trigger, after the row
--   (and so after its RLS check) as a foreign key's check is, locks the
--   message `for key share`, the lock that check takes, and refuses a
--   missing message with the foreign key's own error. So a rating and a
--   concurrent delete of its answer cannot leave a rating of nothing
--   behind: the delete waits for the rating's transaction and then deletes
--   the rating, or the rating waits for the delete and is refused.
-- The other cascades (sessions to messages, feedback and the queues; users
-- to sessions) act per session or per user, and stay foreign keys.

-- Deletes what belonged to the messages a statement deleted. The key tables'
-- rows partition by partition: the messages' ids grouped by their owner's
-- partition (a delete by ids alone would probe all 32 partitions' primary
-- keys per id). It also adds up, per transaction, how many messages went
-- (memchat.deleted_messages), whoever deleted them: the cleanup counts what
-- it deletes without reading it.
create function memchat.delete_message_dependents() returns trigger
language plpgsql security definer
set search_path = ''
as $$
declare
  -- As an array, so each delete is a primary-key lookup per id whatever the
  -- statement's size (a transition table has no statistics to plan a join by).
  ids bigint[] := array(select g.id from gone g);
  v_part record;
begin
  -- Each statement is planned when it runs (EXECUTE); the ids come through a
  -- subquery, so that the planner does not estimate every one of them (what
  -- a plan of the array's value would do, a millisecond per thousand ids).
  -- One partition computed per row; its tables named once per partition,
  -- from one of its users.
  for v_part in
    select (array_agg(g.user_id))[1] as owner, array_agg(g.id) as ids
      from gone g group by memchat.key_partition(g.user_id)
  loop
    execute format('delete from memchat.%I e where e.message_id = any((select $1)::bigint[])',
                   memchat.key_partition_name('message_embeddings', v_part.owner))
      using v_part.ids;
    execute format('delete from memchat.%I f where f.message_id = any((select $1)::bigint[])',
                   memchat.key_partition_name('message_facts', v_part.owner))
      using v_part.ids;
  end loop;
  delete from memchat.message_facts_made m where m.message_id = any(ids);
  delete from memchat.message_feedback f where f.message_id = any(ids);
  perform set_config('memchat.deleted_messages',
    (coalesce(nullif(current_setting('memchat.deleted_messages', true), ''), '0')::bigint
     + cardinality(ids))::text, true);
  return null;
end
$$;

create function memchat.truncate_message_dependents() returns trigger
language plpgsql security definer
set search_path = ''
as $$
begin
  -- A `truncate ... cascade` may have truncated one of them already, in this
  -- same statement (message_feedback references the sessions): a second
  -- truncate of it is refused (object_in_use), so it is emptied by a delete.
  begin
    truncate memchat.message_embeddings;
  exception when object_in_use then
    delete from memchat.message_embeddings;
  end;
  begin
    truncate memchat.message_facts;
  exception when object_in_use then
    delete from memchat.message_facts;
  end;
  truncate memchat.message_facts_made;  -- referenced by nothing, truncated by nothing else
  begin
    truncate memchat.message_feedback;
  exception when object_in_use then
    delete from memchat.message_feedback;
  end;
  return null;
end
$$;

-- The foreign key's check: the message exists, and stays until this
-- transaction ends. SQLSTATE 23503 (foreign_key_violation) otherwise.
create function memchat.lock_referenced_message() returns trigger
language plpgsql security definer
set search_path = ''
as $$
begin
  perform 1 from public.chat_message_history h where h.id = new.message_id for key share;
  if not found then
    raise exception using
      errcode = 'foreign_key_violation',
      message = format('%s: message %s does not exist', tg_table_name, new.message_id);
  end if;
  return null;
end
$$;

-- ======================================================================
-- supabase/schemas/functions/stats.sql
-- ======================================================================

-- A user's stats, as the caller (security invoker, RLS), in one statement
-- each: from their sessions' counters (record_turn keeps them:
-- tables/sessions.sql) and their feedback, never from their messages.
-- The operator's analytics across users: views.sql.

-- The caller's stats over their sessions of p_agent_name (all agents when
-- null): one scan of their sessions (the owner's index) and one of their
-- feedback; with their stored messages and the quota (per user, whatever
-- agent the stats are of).
create function memchat.chat_stats(p_agent_name text) returns jsonb
language plpgsql stable
set search_path = ''
as $$
begin
  return (
    with s as (
      select s.* from public.chat_sessions s
       where s.user_id = (select auth.uid())
         and (p_agent_name is null or s.agent_name = p_agent_name)),
    f as (
      select f.rating, f.comment from memchat.message_feedback f
       where f.user_id = (select auth.uid())
         and (p_agent_name is null or f.agent_name = p_agent_name))
    select jsonb_build_object(
      'agent_name', p_agent_name,
      'sessions', jsonb_build_object(
          'total', count(*),
          'active', count(*) filter (where s.status = 'active' and s.expires_at > now()),
          'cleared', count(*) filter (where s.status = 'cleared')),
      'messages', coalesce(sum(s.message_count), 0),
      'turns', coalesce(sum(s.turn_count), 0),
      'tokens', jsonb_build_object(
          'prompt', coalesce(sum(s.prompt_tokens), 0),
          'completion', coalesce(sum(s.completion_tokens), 0)),
      'feedback', (select jsonb_build_object(
          'positive', count(*) filter (where f.rating = 1),
          'negative', count(*) filter (where f.rating = -1),
          'neutral', count(*) filter (where f.rating = 0),
          'with_comment', count(*) filter (where f.comment is not null)) from f),
      'first_activity_at', min(s.created_at),
      'last_activity_at', max(s.last_active_at),
      'avg_messages_per_session', coalesce(round(avg(s.message_count), 2), 0),
      'storage', jsonb_build_object(
          'stored_messages', memchat.stored_messages(),
          'max_stored_messages', memchat.max_stored_messages()))
    from s);
end
$$;

-- The same for one of the caller's sessions (null if it is not theirs).
create function memchat.session_stats(p_session_id uuid) returns jsonb
language plpgsql stable
set search_path = ''
as $$
begin
  return (
    select jsonb_build_object(
      'session_id', s.id,
      'agent_name', s.agent_name,
      'status', case when s.status = 'active' and s.expires_at <= now() then 'expired'
                     else s.status end,
      'messages', s.message_count,
      'turns', s.turn_count,
      'tokens', jsonb_build_object('prompt', s.prompt_tokens, 'completion', s.completion_tokens),
      'feedback', (select jsonb_build_object(
          'positive', count(*) filter (where f.rating = 1),
          'negative', count(*) filter (where f.rating = -1),
          'neutral', count(*) filter (where f.rating = 0),
          'with_comment', count(*) filter (where f.comment is not null))
          from memchat.message_feedback f where f.session_id = s.id),
      'first_activity_at', s.created_at,
      'last_activity_at', s.last_active_at,
      'duration_seconds', round(extract(epoch from s.last_active_at - s.created_at)::numeric, 3))
    from public.chat_sessions s
    where s.id = p_session_id and s.user_id = (select auth.uid()));
end
$$;

-- ======================================================================
-- supabase/schemas/functions/import.sql
-- ======================================================================

-- History import: conversations from a file, with their original
-- timestamps (POST /sessions/import, `memchat import`).
--
-- memchat.import_sessions stores one batch of imported sessions in one call:
-- the sessions, their messages in order, the feedback on their answers, their
-- rolling summaries, and notes for agents the caller has none for. It runs as
-- the caller (security invoker), so row-level security, memchat.limits and
-- the tables' triggers hold exactly as for a chat turn.
--
-- Idempotent: an imported session's key is its id, unique per user by the
-- primary key (id, user_id). The API gives it the id the file names or, when
-- the file names none, one derived from its content (memchat.usecases.
-- history_import), so a session the caller already has, from an earlier
-- import or any other way, is skipped with all its messages, and importing a
-- file twice stores nothing twice. The caller's expired sessions with the
-- ids given are deleted first (with their messages and what depends on
-- them), so they are imported, not skipped. Notes are never written over:
-- an agent the caller already has notes for keeps them.
--
-- Imported sessions are ordinary sessions: they expire p_ttl from the import,
-- whatever their dates (their created_at and last_active_at are the file's),
-- their counters (messages, turns, tokens) are those a turn would have kept,
-- and the cleanup, clear-session and DELETE /me treat them as any other.
-- The quota (memchat.hold_stored_messages) holds: with p_request
-- ([{"id", "messages"}]: every session of the whole request, the first
-- transaction's call) for the request's messages in sessions the caller
-- does not have live, and every call for what it stores itself.
--
-- p_sessions: [{"id", "agent_name", "title", "status", "created_at",
--   "last_active_at", "summary", "summary_covers" (the ordinal, from 1, of the
--   last message the summary covers), "summary_updated_at", "messages":
--   [{"message" (LangChain's shape), "created_at", "client_message_id"}]}],
--   each id once.
-- p_feedback: [{"session_id", "ordinal" (of the rated message, from 1),
--   "rating", "comment", "created_at", "updated_at"}].
-- p_notes: [{"agent_name", "notes", "created_at", "updated_at"}].
-- Returns {"sessions": [ids stored], "notes": [agent names stored]}: what is
-- not in them the caller had already.
create function memchat.import_sessions(
  p_sessions jsonb, p_feedback jsonb, p_notes jsonb, p_ttl interval, p_request jsonb
) returns jsonb
language plpgsql
set search_path = ''
as $$
declare
  v_uid uuid := auth.uid();
  v_stored uuid[];
  v_ids bigint[];
  v_owners uuid[];
  v_notes text[];
begin
  delete from public.chat_sessions s
   using jsonb_to_recordset(p_sessions) as g(id uuid)
   where s.id = g.id and s.user_id = v_uid and s.expires_at <= now();

  if p_request is not null then
    perform memchat.hold_stored_messages(
      (select coalesce(sum(r.messages), 0)::bigint
         from jsonb_to_recordset(p_request) as r(id uuid, messages bigint)
        where not exists (select 1 from public.chat_sessions s
                           where s.id = r.id and s.user_id = v_uid and s.expires_at > now())));
  else
    perform memchat.hold_stored_messages(
      (select coalesce(sum(jsonb_array_length(g.messages)), 0)::bigint
         from jsonb_to_recordset(p_sessions) as g(id uuid, messages jsonb)
        where not exists (select 1 from public.chat_sessions s
                           where s.id = g.id and s.user_id = v_uid)));
  end if;

  -- Counters as record_turn keeps them: a turn per user message, the tokens
  -- the answers' usage carries.
  with given as (
    select g.* from jsonb_to_recordset(p_sessions) as g(
      id uuid, agent_name text, title text, status text,
      created_at timestamptz, last_active_at timestamptz, messages jsonb)
  ), inserted as (
    insert into public.chat_sessions as s
        (id, user_id, agent_name, title, status, message_count, created_at, last_active_at,
         expires_at, turn_count, prompt_tokens, completion_tokens)
    select g.id, v_uid, g.agent_name, g.title, g.status, jsonb_array_length(g.messages),
           g.created_at, g.last_active_at, memchat.session_expiry(p_ttl),
           c.turns, c.prompt, c.completion
      from given g
      cross join lateral (
        select count(*) filter (where m.item->'message'->>'type' = 'human') as turns,
               coalesce(sum((m.item->'message'->'data'->'usage_metadata'->>'input_tokens')::bigint)
                          filter (where m.item->'message'->>'type' = 'ai'), 0) as prompt,
               coalesce(sum((m.item->'message'->'data'->'usage_metadata'->>'output_tokens')::bigint)
                          filter (where m.item->'message'->>'type' = 'ai'), 0) as completion
          from jsonb_array_elements(g.messages) as m(item)) c
    on conflict (id, user_id) do nothing
    returning s.id)
  select coalesce(array_agg(i.id), '{}') into v_stored from inserted i;

  -- One statement per batch, its rows in the file's order, so each session's
  -- messages get ascending ids in that order (as a turn's do).
  with inserted as (
    insert into public.chat_message_history
        (session_id, user_id, message, client_message_id, created_at)
    select g.id, v_uid, m.item->'message', m.item->>'client_message_id',
           (m.item->>'created_at')::timestamptz
      from jsonb_to_recordset(p_sessions) as g(id uuid, messages jsonb)
      cross join lateral jsonb_array_elements(g.messages) with ordinality as m(item, ord)
     where g.id = any(v_stored)
     order by g.id, m.ord
    returning id, session_id)
  select coalesce(array_agg(i.id order by i.id), '{}'), coalesce(array_agg(i.session_id order by i.id), '{}')
    into v_ids, v_owners
    from inserted i;

  -- What refers to a message by its place in its session: feedback on an
  -- answer, the last message a summary covers. A statement of its own, after
  -- the messages, as the feedback's row-level security checks its message.
  with numbered as (
    select n.id, n.session_id,
           row_number() over (partition by n.session_id order by n.id) as ordinal
      from unnest(v_ids, v_owners) as n(id, session_id)
  )
  insert into memchat.message_feedback
      (message_id, user_id, session_id, agent_name, rating, comment, created_at, updated_at)
  select n.id, v_uid, n.session_id, s.agent_name, f.rating, f.comment,
         coalesce(f.created_at, now()), coalesce(f.updated_at, f.created_at, now())
    from jsonb_to_recordset(p_feedback) as f(
           session_id uuid, ordinal bigint, rating smallint, comment text,
           created_at timestamptz, updated_at timestamptz)
    join numbered n on n.session_id = f.session_id and n.ordinal = f.ordinal
    join public.chat_sessions s on s.id = n.session_id and s.user_id = v_uid;

  with numbered as (
    select n.id, n.session_id,
           row_number() over (partition by n.session_id order by n.id) as ordinal
      from unnest(v_ids, v_owners) as n(id, session_id)
  )
  update public.chat_sessions s
     set summary = g.summary, summary_covers_until = n.id,
         summary_covers_count = g.summary_covers, summary_updated_at = g.summary_updated_at
    from jsonb_to_recordset(p_sessions) as g(
           id uuid, summary text, summary_covers integer, summary_updated_at timestamptz)
    join numbered n on n.session_id = g.id and n.ordinal = g.summary_covers
   where s.id = g.id and s.user_id = v_uid and g.summary is not null;

  with inserted as (
    insert into public.agent_long_term_memory as m
        (user_id, agent_name, notes, created_at, updated_at)
    select v_uid, n.agent_name, n.notes, coalesce(n.created_at, now()),
           coalesce(n.updated_at, n.created_at, now())
      from jsonb_to_recordset(p_notes) as n(
             agent_name text, notes text, created_at timestamptz, updated_at timestamptz)
    on conflict (user_id, agent_name) do nothing
    returning m.agent_name)
  select coalesce(array_agg(i.agent_name), '{}') into v_notes from inserted i;

  return jsonb_build_object('sessions', to_jsonb(v_stored), 'notes', to_jsonb(v_notes));
end
$$;

-- ======================================================================
-- supabase/schemas/triggers.sql
-- ======================================================================

-- Every trigger, by table. Triggers of one event fire in the order of their
-- names. Their functions: functions/limits.sql (limits), functions/turns.sql
-- (user_id filled in), functions/notes.sql (versions), functions/cleanup.sql
-- (a message's dependents), functions/words.sql (a round's words).

-- ------------------------------------------------------- sessions
create trigger chat_sessions_limits
  before insert or update on public.chat_sessions
  for each row execute function memchat.check_session();

-- ------------------------------------------------------- messages
-- LangChain's add_messages leaves user_id out: filled from the session.
create trigger chat_message_history_fill_user_id
  before insert on public.chat_message_history
  for each row execute function memchat.fill_message_user_id();
create trigger chat_message_history_limits
  before insert or update on public.chat_message_history
  for each row execute function memchat.check_message();
-- A message's embedding, fact keys and feedback go with it, a statement at
-- a time (no per-row foreign key: functions/cleanup.sql).
create trigger chat_message_history_dependents
  after delete on public.chat_message_history
  referencing old table as gone
  for each statement execute function memchat.delete_message_dependents();
create trigger chat_message_history_truncate
  after truncate on public.chat_message_history
  for each statement execute function memchat.truncate_message_dependents();

-- ------------------------------------------------------- notes
create trigger agent_long_term_memory_limits
  before insert or update of notes on public.agent_long_term_memory
  for each row execute function memchat.check_notes();
create trigger agent_long_term_memory_versions
  after insert or update of notes, version or delete on public.agent_long_term_memory
  for each row execute function memchat.keep_notes_version();

-- ------------------------------------------------------- what refers to a message
-- The foreign key's check, on a row that names its message by id alone.
create trigger message_embeddings_message
  after insert or update of message_id on memchat.message_embeddings
  for each row execute function memchat.lock_referenced_message();
create trigger message_facts_message
  after insert or update of message_id on memchat.message_facts
  for each row execute function memchat.lock_referenced_message();
create trigger message_feedback_message
  after insert or update of message_id on memchat.message_feedback
  for each row execute function memchat.lock_referenced_message();
-- A stored embedding's round: its lexemes, and its fact keys due or not.
create trigger message_embeddings_index_round
  before insert on memchat.message_embeddings
  for each row execute function memchat.index_round();

-- ======================================================================
-- supabase/schemas/views.sql
-- ======================================================================

-- The operator's analytics, across all users (docs/analytics.md says what
-- each column means), without anything a user wrote.
--
-- * The views run with their owner's rights (security_invoker = false; the
--   owner is the role that applies the schema, which owns the tables:
--   `postgres` on Supabase), so reading them needs select on the view only
--   (grants.sql: `memchat_analyst`'s only rights), and what they expose is
--   all that reader gets: counts, token usage, latencies, ratings, timings,
--   model and agent names, and a pseudonymised user id. No text a user
--   wrote, no message, session or user id.
-- * The pseudonyms are HMAC-SHA256 under the secret of memchat.analytics_key
--   (tables/analytics_key.sql), which only the owner can read.
-- * The views are security barriers: a function in a reader's where clause
--   is not run on rows a view filters out before the view has filtered them.
-- Joins between messages and sessions match the session id and the user id
-- (session ids are unique per user only).

-- Every turn with its user's and session's ids, for the owner's views only:
-- the aggregates count distinct raw ids (cheaper than hashing every row),
-- and only memchat_analytics.turns, which hashes them, is shown. A turn is
-- its final answer: an assistant message without tool calls. Its session is
-- a left join on the session's whole key (id and user): a message's session
-- always exists (its foreign key), and a view that reads no session column
-- (daily_active_users, daily_usage) then skips the join altogether instead
-- of looking up a session per answer.
create view memchat.analytics_turns as
select h.session_id,
       h.user_id,
       s.agent_name,
       h.created_at,
       (h.created_at at time zone 'UTC')::date as day,
       coalesce(h.message->'data'->'response_metadata'->>'model_name', 'unknown') as model,
       coalesce((h.message->'data'->'usage_metadata'->>'input_tokens')::bigint, 0)
         as prompt_tokens,
       coalesce((h.message->'data'->'usage_metadata'->>'output_tokens')::bigint, 0)
         as completion_tokens,
       (h.message->'data'->'response_metadata'->>'latency_ms')::double precision as latency_ms,
       coalesce((h.message->'data'->'response_metadata'->'memchat'->>'recalled')::integer, 0)
         as recalled,
       coalesce((h.message->'data'->'response_metadata'->'memchat'->>'summary_used')::boolean,
                false) as summary_used
  from public.chat_message_history h
  left join public.chat_sessions s on s.id = h.session_id and s.user_id = h.user_id
 where h.message->>'type' = 'ai'
   and coalesce(jsonb_array_length(h.message->'data'->'tool_calls'), 0) = 0;

-- The pads as scalar subqueries: each is read once per query (an InitPlan),
-- and the key's one row does not enter the join, or its estimates.
create view memchat_analytics.turns
  with (security_invoker = false, security_barrier = true) as
select encode(sha256((select k.outer_pad from memchat.analytics_key k)
                     || sha256((select k.inner_pad from memchat.analytics_key k)
                               || uuid_send(t.user_id))),
              'hex') as user_pseudonym,
       encode(sha256((select k.outer_pad from memchat.analytics_key k)
                     || sha256((select k.inner_pad from memchat.analytics_key k)
                               || uuid_send(t.user_id) || uuid_send(t.session_id))),
              'hex') as session_pseudonym,
       t.agent_name, t.created_at, t.day, t.model, t.prompt_tokens, t.completion_tokens,
       t.latency_ms, t.recalled, t.summary_used
  from memchat.analytics_turns t;
comment on view memchat_analytics.turns is
  'One row per stored turn: pseudonymised user and session, agent, model, tokens, latency,'
  ' memory use. No text, no ids.';

create view memchat_analytics.daily_active_users
  with (security_invoker = false, security_barrier = true) as
select t.day, count(distinct t.user_id) as users, count(*) as turns
  from memchat.analytics_turns t
 group by t.day;

create view memchat_analytics.daily_usage
  with (security_invoker = false, security_barrier = true) as
select t.day, t.model, count(*) as turns, count(distinct t.user_id) as users,
       sum(t.prompt_tokens) as prompt_tokens, sum(t.completion_tokens) as completion_tokens,
       round(avg(t.latency_ms)::numeric, 1) as avg_latency_ms,
       round((percentile_cont(0.95) within group (order by t.latency_ms))::numeric, 1)
         as p95_latency_ms
  from memchat.analytics_turns t
 group by t.day, t.model;

-- How many ratings carry a comment, never the comment.
create view memchat_analytics.daily_feedback
  with (security_invoker = false, security_barrier = true) as
select (f.updated_at at time zone 'UTC')::date as day, f.agent_name,
       count(*) as ratings,
       count(*) filter (where f.rating = 1) as positive,
       count(*) filter (where f.rating = -1) as negative,
       count(*) filter (where f.rating = 0) as neutral,
       count(*) filter (where f.comment is not null) as with_comment,
       round(avg((f.rating = 1)::int)::numeric, 3) as positive_rate,
       round(avg((f.rating = -1)::int)::numeric, 3) as negative_rate
  from memchat.message_feedback f
 group by 1, 2;

create view memchat_analytics.session_lengths
  with (security_invoker = false, security_barrier = true) as
select b.bucket, b.lower_bound, count(*) as sessions,
       round(avg(s.turn_count)::numeric, 1) as avg_turns,
       round(avg(extract(epoch from s.last_active_at - s.created_at))::numeric, 1)
         as avg_duration_seconds
  from public.chat_sessions s
  cross join lateral (
    select case when s.turn_count <= 1 then '1 turn'
                when s.turn_count <= 5 then '2-5 turns'
                when s.turn_count <= 20 then '6-20 turns'
                when s.turn_count <= 100 then '21-100 turns'
                else 'over 100 turns' end as bucket,
           case when s.turn_count <= 1 then 0
                when s.turn_count <= 5 then 2
                when s.turn_count <= 20 then 6
                when s.turn_count <= 100 then 21
                else 101 end as lower_bound) b
 where s.turn_count > 0
 group by b.bucket, b.lower_bound;

create view memchat_analytics.daily_memory_use
  with (security_invoker = false, security_barrier = true) as
select t.day, t.agent_name, count(*) as turns,
       count(*) filter (where t.recalled > 0) as turns_with_recall,
       sum(t.recalled) as exchanges_recalled,
       count(*) filter (where t.summary_used) as turns_with_summary,
       round(avg((t.recalled > 0)::int)::numeric, 3) as recall_rate,
       round(avg(t.summary_used::int)::numeric, 3) as summary_rate
  from memchat.analytics_turns t
 group by t.day, t.agent_name;

-- ======================================================================
-- supabase/schemas/policies.sql
-- ======================================================================

-- Row-level security on every table, and every policy. A role reads and
-- writes through these what grants.sql lets it touch at all.
--
-- Who each policy is for: the Data API (`authenticated`, whose member
-- `memchat_user` reads as it does), the API's writes (`memchat_user`), the
-- TTL cleanup (`memchat_cleanup`: expired rows only, for no user). The
-- summary worker and the embedding backfill (`memchat_worker`) and the
-- operator's analytics (`memchat_analyst`) have none: they read through
-- SECURITY DEFINER functions and owner-rights views. Every policy for a
-- user calls `(select auth.uid())`, evaluated once per statement, not per
-- row; an index led by user_id serves each.

alter table public.chat_sessions enable row level security;
alter table public.user_agent_active_sessions enable row level security;
alter table public.chat_message_history enable row level security;
alter table public.agent_long_term_memory enable row level security;
alter table memchat.notes_versions enable row level security;
alter table memchat.rate_buckets enable row level security;
alter table memchat.turn_claims enable row level security;
alter table memchat.summary_queue enable row level security;
alter table memchat.embedding_queue enable row level security;
alter table memchat.message_feedback enable row level security;
-- The partitions' own: tables/recall_keys.sql.
alter table memchat.message_embeddings enable row level security;
alter table memchat.message_facts enable row level security;
alter table memchat.message_facts_made enable row level security;
-- No policy: only the owner reads these (through its SECURITY DEFINER
-- functions), every row refused to every other role.
alter table memchat.word_statistics enable row level security;
alter table memchat.common_words enable row level security;
alter table memchat.analytics_key enable row level security;

-- ------------------------------------------------------- sessions
create policy chat_sessions_select on public.chat_sessions
  for select to authenticated using (user_id = (select auth.uid()));
create policy chat_sessions_delete on public.chat_sessions
  for delete to authenticated using (user_id = (select auth.uid()));
create policy chat_sessions_insert on public.chat_sessions
  for insert to memchat_user with check (user_id = (select auth.uid()));
create policy chat_sessions_update on public.chat_sessions
  for update to memchat_user
  using (user_id = (select auth.uid())) with check (user_id = (select auth.uid()));
-- The cleanup sees expired sessions only.
create policy chat_sessions_cleanup_select on public.chat_sessions
  for select to memchat_cleanup using (expires_at <= now());
-- Lets the cleanup lock (FOR UPDATE SKIP LOCKED) what it is about to delete;
-- it can never change a row.
create policy chat_sessions_cleanup_lock on public.chat_sessions
  for update to memchat_cleanup using (expires_at <= now()) with check (false);
create policy chat_sessions_cleanup_delete on public.chat_sessions
  for delete to memchat_cleanup using (expires_at <= now());

-- An active-session pointer names a session of its own user.
create policy active_sessions_select on public.user_agent_active_sessions
  for select to authenticated using (user_id = (select auth.uid()));
create policy active_sessions_insert on public.user_agent_active_sessions
  for insert to authenticated with check (
    user_id = (select auth.uid())
    and exists (select 1 from public.chat_sessions s
                where s.id = active_session_id and s.user_id = (select auth.uid())));
create policy active_sessions_update on public.user_agent_active_sessions
  for update to authenticated
  using (user_id = (select auth.uid()))
  with check (
    user_id = (select auth.uid())
    and exists (select 1 from public.chat_sessions s
                where s.id = active_session_id and s.user_id = (select auth.uid())));
create policy active_sessions_delete on public.user_agent_active_sessions
  for delete to memchat_user using (user_id = (select auth.uid()));

-- ------------------------------------------------------- messages
-- Messages are immutable: no update grant, so no update policy.
create policy messages_select on public.chat_message_history
  for select to authenticated using (user_id = (select auth.uid()));
create policy messages_insert on public.chat_message_history
  for insert to memchat_user with check (
    user_id = (select auth.uid())
    and exists (select 1 from public.chat_sessions s
                where s.id = session_id and s.user_id = (select auth.uid())));
create policy messages_delete on public.chat_message_history
  for delete to memchat_user using (user_id = (select auth.uid()));
-- Of messages, the cleanup may read the ids of expired sessions' only
-- (`memchat cleanup --dry-run` counts them).
create policy messages_cleanup_count on public.chat_message_history
  for select to memchat_cleanup using (exists (
    select 1 from public.chat_sessions s
     where s.id = chat_message_history.session_id
       and s.user_id = chat_message_history.user_id
       and s.expires_at <= now()));

-- ------------------------------------------------------- notes
create policy ltm_select on public.agent_long_term_memory
  for select to authenticated using (user_id = (select auth.uid()));
create policy ltm_insert on public.agent_long_term_memory
  for insert to memchat_user with check (user_id = (select auth.uid()));
create policy ltm_update on public.agent_long_term_memory
  for update to memchat_user
  using (user_id = (select auth.uid())) with check (user_id = (select auth.uid()));
create policy ltm_delete on public.agent_long_term_memory
  for delete to memchat_user using (user_id = (select auth.uid()));

-- Written by the trigger only (as the owner); the caller reads its own.
create policy notes_versions_own on memchat.notes_versions for select to memchat_user
  using (user_id = (select auth.uid()));

-- ------------------------------------------------------- throttles, claims
create policy rate_buckets_own on memchat.rate_buckets for all to memchat_user
  using (user_id = (select auth.uid())) with check (user_id = (select auth.uid()));
-- A bucket untouched for a day: the cleanup deletes it (tables/throttles.sql).
create policy rate_buckets_cleanup_select on memchat.rate_buckets
  for select to memchat_cleanup using (refilled_at < now() - interval '1 day');
create policy rate_buckets_cleanup_delete on memchat.rate_buckets
  for delete to memchat_cleanup using (refilled_at < now() - interval '1 day');

create policy turn_claims_own on memchat.turn_claims for all to memchat_user
  using (user_id = (select auth.uid())) with check (user_id = (select auth.uid()));
create policy turn_claims_cleanup on memchat.turn_claims
  for select to memchat_cleanup using (expires_at <= now());
create policy turn_claims_cleanup_delete on memchat.turn_claims
  for delete to memchat_cleanup using (expires_at <= now());

-- ------------------------------------------------------- queues
-- The caller's own sessions only (the foreign key says the same).
create policy summary_queue_own on memchat.summary_queue for all to memchat_user
  using (user_id = (select auth.uid()))
  with check (user_id = (select auth.uid()) and exists (
    select 1 from public.chat_sessions s
     where s.id = summary_queue.session_id and s.user_id = (select auth.uid())));
create policy embedding_queue_own on memchat.embedding_queue for all to memchat_user
  using (user_id = (select auth.uid()))
  with check (user_id = (select auth.uid()) and exists (
    select 1 from public.chat_sessions s
     where s.id = embedding_queue.session_id and s.user_id = (select auth.uid())));

-- ------------------------------------------------------- feedback
-- A rating is of one of the caller's own messages, in its own session.
create policy message_feedback_own on memchat.message_feedback for all to memchat_user
  using (user_id = (select auth.uid()))
  with check (user_id = (select auth.uid()) and exists (
    select 1 from public.chat_message_history h
     where h.id = message_feedback.message_id and h.session_id = message_feedback.session_id
       and h.user_id = (select auth.uid())));

-- ------------------------------------------------------- recall keys
create policy message_embeddings_select on memchat.message_embeddings
  for select to memchat_user using (user_id = (select auth.uid()));
create policy message_embeddings_insert on memchat.message_embeddings
  for insert to memchat_user with check (
    user_id = (select auth.uid())
    and exists (select 1 from public.chat_message_history h
                where h.id = message_id and h.user_id = (select auth.uid())
                  and h.session_id = message_embeddings.session_id));
create policy message_facts_select on memchat.message_facts for select to memchat_user
  using (user_id = (select auth.uid()));
-- The caller reads its own (memchat.embedding_backlog runs as the caller).
create policy message_facts_made_select on memchat.message_facts_made for select to memchat_user
  using (user_id = (select auth.uid()));

-- ======================================================================
-- supabase/schemas/grants.sql
-- ======================================================================

-- Every privilege memchat grants, by role; none to `anon`. docs/deploy.md
-- ("Roles: exactly what each may do") states the result, and a test
-- compares that statement with the catalog. What each role reads of the
-- rows it may touch: policies.sql.
--
-- Supabase's default privileges grant everything on what its owner creates
-- in `public` to the Data API's roles (infra/bootstrap.sql does the same
-- locally), and may grant new tables elsewhere: every right is taken back
-- explicitly, then given.

-- ======================================================= schemas
revoke all on schema memchat from public;
grant usage on schema memchat to service_role, memchat_user, memchat_cleanup, memchat_worker;
revoke all on schema memchat_analytics from public;
grant usage on schema memchat_analytics to memchat_analyst;

-- ======================================================= the user tables
revoke all on public.chat_sessions, public.user_agent_active_sessions,
  public.chat_message_history, public.agent_long_term_memory from public, anon, authenticated;
grant all on public.chat_sessions, public.user_agent_active_sessions,
  public.chat_message_history, public.agent_long_term_memory to service_role;
-- `select setval(...)` through the Data API would move the message ids.
revoke all on all sequences in schema public from public, anon, authenticated;

-- The Data API (`authenticated`): read, not write, but for deleting a
-- session and upserting its active-session pointer. An upsert from
-- supabase-js sets every column it sends: these three.
grant select on public.chat_sessions, public.user_agent_active_sessions,
  public.chat_message_history, public.agent_long_term_memory to authenticated;
grant delete on public.chat_sessions to authenticated;
grant insert (user_id, agent_name, active_session_id),
  update (user_id, agent_name, active_session_id)
  on public.user_agent_active_sessions to authenticated;

-- The API (`memchat_user`, besides what it reads as `authenticated`).
-- Messages: every column but the id (always generated: tables/messages.sql).
grant insert, update on public.chat_sessions to memchat_user;
grant insert, update, delete on public.user_agent_active_sessions to memchat_user;
grant insert (session_id, user_id, message, client_message_id, created_at), delete
  on public.chat_message_history to memchat_user;
grant insert, update, delete on public.agent_long_term_memory to memchat_user;

-- The cleanup (`memchat_cleanup`): expired sessions (policies.sql); of
-- messages, their ids (to count them), no content.
grant select (id, user_id, expires_at), update (expires_at), delete
  on public.chat_sessions to memchat_cleanup;
grant select (id, session_id, user_id) on public.chat_message_history to memchat_cleanup;

-- ======================================================= memchat's tables
revoke all on memchat.limits, memchat.notes_versions, memchat.rate_buckets,
  memchat.turn_claims, memchat.summary_queue, memchat.message_feedback
  from public;
revoke all on memchat.embedding_queue, memchat.message_embeddings, memchat.message_facts,
  memchat.message_facts_made, memchat.word_statistics, memchat.common_words,
  memchat.analytics_key
  from public, anon, authenticated, service_role;

grant select on memchat.limits to memchat_user, service_role;
grant select on memchat.notes_versions to memchat_user;
grant select, insert, update on memchat.rate_buckets to memchat_user;
grant select, insert, update, delete on memchat.turn_claims to memchat_user;
grant select, insert, update, delete on memchat.summary_queue to memchat_user;
grant select, insert, update on memchat.embedding_queue to memchat_user;
grant select, insert, update, delete on memchat.message_feedback to memchat_user;
grant select, insert on memchat.message_embeddings to memchat_user;
grant select on memchat.message_facts, memchat.message_facts_made to memchat_user;

-- Expired claims and full buckets (policies.sql).
grant select (expires_at), delete on memchat.turn_claims to memchat_cleanup;
grant select (refilled_at), delete on memchat.rate_buckets to memchat_cleanup;

-- ======================================================= the analytics
-- The views show every user's rows to whoever may select them: the analyst
-- only. The view beneath them is the owner's alone.
revoke all on memchat.analytics_turns from public, anon, authenticated, service_role;
revoke all on all tables in schema memchat_analytics
  from public, anon, authenticated, service_role;
grant select on all tables in schema memchat_analytics to memchat_analyst;

-- ======================================================= functions
-- None for PUBLIC; each to the roles that call it. Those granted to no one
-- are the owner's: trigger functions, the helpers of SECURITY DEFINER
-- functions and of the schema itself. memchat.nearest_keys_indexed is
-- granted by memchat.index_recall_keys, which writes it.
revoke all on all functions in schema memchat from public;

-- The API, as the user (`memchat_user`).
grant execute on function
  -- a turn (functions/turns.sql, functions/requests.sql, functions/notes.sql)
  memchat.load_context(uuid, text, integer, boolean, text, text, double precision, integer,
                       double precision, integer),
  memchat.record_turn(uuid, text, text, jsonb, interval, text, text, integer, boolean,
                      extensions.vector, text, integer),
  memchat.chat_of_history(text, text[], text[], integer),
  memchat.current_user_exists(),
  memchat.take_rate_token(text, double precision, integer),
  memchat.throttle(text, double precision, integer),
  memchat.save_notes(text, text, integer),
  memchat.restore_notes(text, integer, integer),
  -- limits (functions/limits.sql)
  memchat.session_expiry(interval),
  memchat.stored_messages(),
  memchat.max_stored_messages(),
  memchat.hold_stored_messages(bigint),
  -- recall (functions/recall.sql, functions/words.sql)
  memchat.recall(uuid, text, integer, extensions.vector, text, text, integer, double precision,
                 double precision, timestamptz, timestamptz),
  memchat.recall_hits(bigint[], double precision[], uuid, bigint),
  memchat.recall_keys(uuid, text, text, uuid, bigint),
  memchat.nearest_messages(uuid, text, text, uuid, bigint, extensions.vector, integer,
                           timestamptz, timestamptz),
  memchat.answer_after(uuid, uuid, bigint),
  memchat.answer_of(bigint),
  memchat.vector_iterative_scans(),
  memchat.ann_from_messages(),
  memchat.recall_ef_search(real, bigint),
  memchat.recall_index_ready(),
  memchat.any_words(text),
  memchat.round_lexemes(text, text),
  memchat.owner_lexeme(uuid),
  memchat.owned_lexemes(tsvector, uuid),
  memchat.words_budget(),
  memchat.rarer_words(tsquery, bigint, integer),
  memchat.rounds_matching(text, text, tsquery, uuid, bigint, integer, bigint),
  memchat.key_partition(uuid),
  memchat.key_partition_name(text, uuid),
  memchat.key_partition_of(text, uuid),
  -- embeddings (functions/embeddings.sql)
  memchat.embedding_dimensions(),
  memchat.embeddable(jsonb),
  memchat.unembedded_messages(uuid, uuid, text),
  memchat.says_several_things(text),
  memchat.queue_embeddings(uuid[]),
  memchat.embedding_backlog(),
  -- stats, import (functions/stats.sql, functions/import.sql)
  memchat.chat_stats(text),
  memchat.session_stats(uuid),
  memchat.import_sessions(jsonb, jsonb, jsonb, interval, jsonb)
  to memchat_user;

-- The summary worker and the embedding backfill (`memchat_worker`): these
-- functions, nothing else (functions/summaries.sql, functions/embeddings.sql).
-- It also reads the column's size, to embed nothing that cannot be stored.
grant execute on function
  memchat.summary_claim(integer, double precision),
  memchat.summary_lag(),
  memchat.summary_source(uuid, integer, integer),
  memchat.summary_save(uuid, text, bigint, bigint),
  memchat.summary_done(uuid, integer),
  memchat.summary_failed(uuid, double precision),
  memchat.embedding_claim(integer, double precision),
  memchat.embedding_source(uuid, text, bigint, integer),
  memchat.embedding_save(uuid[], text, bigint[], text[]),
  memchat.facts_save(uuid[], bigint[], text, bigint[], integer[], text[]),
  memchat.embedding_done(uuid, text),
  memchat.embedding_failed(uuid, double precision),
  memchat.embedding_statistics(),
  memchat.embedding_dimensions()
  to memchat_worker;

-- Supabase's `service_role`.
grant execute on function memchat.current_user_exists(), memchat.save_notes(text, text, integer)
  to service_role;
