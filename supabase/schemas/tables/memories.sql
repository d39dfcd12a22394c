-- Durable memory: what a session's messages stated, kept apart from the
-- transcript so that it outlives it (docs/api.md, "Memories"). Written by
-- the embedding backfill (memchat.memories_save); read and deleted by their
-- user (GET and DELETE /memories), searched by recall once their session is
-- gone (memories_durable_idx). Row-level security, privileges: policies.sql,
-- grants.sql; the session's end (trigger chat_sessions_memories): triggers.sql.
--
-- The clock: while its session lives a memory's expires_at is null (it
-- lasts as long as the session, whose expiry slides with every turn); when
-- the cleanup deletes the expired session, its memories get expires_at =
-- the session's expiry + MEMORY_RETENTION_DAYS (0: that expiry, so they go
-- in the same run), and the cleanup deletes them once it has passed. A
-- session deleted otherwise (by its user through the Data API) takes its
-- memories with it.
create table memchat.memories (
  id bigint generated always as identity,
  user_id uuid not null references auth.users (id) on delete cascade,
  agent_name text not null check (agent_name ~ '^[A-Za-z0-9_.-]{1,64}$'),
  -- fact: a sentence in which the user speaks of themselves; assistant: one
  -- in which the assistant does (memchat.usecases.recall.facts); summary:
  -- the session's rolling summary, one per session, written by the summary
  -- worker (memchat.summary_remember).
  kind text not null check (kind in ('fact', 'assistant', 'summary')),
  text text not null check (char_length(text) between 1 and 4000),
  -- Where it was stated: no foreign keys, as both go before the memory does.
  session_id uuid not null,
  message_id bigint not null,
  -- Which of its message's memories (0, 1, ...); a summary's, -1 (its
  -- message: the last one it covers).
  ordinal smallint not null,
  -- When it was stated (its message's created_at).
  created_at timestamptz not null,
  expires_at timestamptz,
  -- The embedding (of `model`, as the message keys'; null after a change of
  -- the column's size, `memchat db reembed --dimensions`: found by words
  -- only) and the words recall finds it by.
  model text,
  embedding extensions.vector(512),
  lexemes tsvector generated always as (to_tsvector('english'::regconfig, text)) stored,
  primary key (user_id, id),
  unique (user_id, message_id, ordinal),
  constraint memories_ordinal_check check ((kind = 'summary') = (ordinal = -1) and ordinal >= -1)
);
alter table memchat.memories alter column embedding set storage main;
comment on table memchat.memories is
  'Durable memory: the facts each message stated and each session''s summary, with their date and '
  'session; outlives the '
  'transcript by MEMORY_RETENTION_DAYS (supabase/schemas/tables/memories.sql).';
comment on column memchat.memories.expires_at is
  'Null while the session lives; set when the cleanup deletes the session.';

create index memories_owner_idx on memchat.memories
  (user_id, created_at desc, message_id desc, ordinal desc);
create index memories_session_idx on memchat.memories (session_id) where expires_at is null;
create index memories_expiry_idx on memchat.memories (expires_at) where expires_at is not null;
create index memories_durable_idx on memchat.memories (user_id, agent_name)
  where expires_at is not null;
-- What the backfill has to embed (memchat.memory_embedding_source).
create index memories_unembedded_idx on memchat.memories (id) where embedding is null;

-- What a user deleted of the memories a message made (DELETE /memories/{id}):
-- memchat.memories_save never writes them again (`memchat db reembed` reads
-- the message anew). Goes with its message (memchat.delete_message_dependents).
create table memchat.forgotten_memories (
  message_id bigint not null,
  ordinal smallint not null,
  user_id uuid not null references auth.users (id) on delete cascade,
  primary key (message_id, ordinal, user_id)
);
create index forgotten_memories_user_idx on memchat.forgotten_memories (user_id);
comment on table memchat.forgotten_memories is
  'The (message, ordinal) of each memory its user deleted, never written again.';
