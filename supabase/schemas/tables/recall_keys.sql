-- What recall searches (functions/recall.sql, functions/words.sql): each
-- embedded message's embedding (the user's and the assistant's) and the
-- lexemes of its round, and a user message's fact keys; what the backfill has done (functions/embeddings.sql); a copy
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
  -- The exchange an assistant message's embedding is a key of: the user
  -- message it answers (the last user message before it in its session).
  -- Null: the message is its own exchange (a user message; an assistant
  -- message no user message came before, which opens its session).
  exchange_id bigint,
  -- A unique key of a partitioned table holds the partition's column.
  primary key (message_id, user_id)
) partition by hash (user_id);
alter table memchat.message_embeddings alter column embedding set storage main;
alter table memchat.message_embeddings alter column lexemes set storage main;
comment on table memchat.message_embeddings is
  'The embedding of each stored message with text (the user''s and the assistant''s), for recall, partitioned by user '
  '(memchat.key_partition). Goes with its message (trigger chat_message_history_dependents).';
comment on column memchat.message_embeddings.model is
  'The embedding model that made the vector (OPENAI_EMBEDDING_MODEL); recall compares '
  'only vectors of one model. Null: unknown (stored before models were recorded), never '
  'recalled.';
comment on column memchat.message_embeddings.facts_model is
  'The model whose fact keys (memchat.message_facts) the message has; null: not yet.';
comment on column memchat.message_embeddings.lexemes is
  'The full-text lexemes of the message''s round: its text (weight A), its answer''s (B), '
  'and its owner''s lexeme (memchat.owner_lexeme), so that the GIN index finds one user''s rounds; '
  'an assistant message that opens its session: its text (B); null for an answer (its round is its '
  'question''s).';
comment on column memchat.message_embeddings.exchange_id is
  'The user message whose exchange an answer''s embedding is a key of; null: its own.';

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
-- An exchange's answers' keys, read for a recall candidate's similarity.
create index message_embeddings_exchange_idx on memchat.message_embeddings (exchange_id)
  where exchange_id is not null;
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
  message_id bigint not null,
  user_id uuid not null,
  model text not null,
  primary key (message_id, user_id)
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
