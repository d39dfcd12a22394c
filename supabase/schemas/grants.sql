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

-- The cleanup (`memchat_cleanup`): expired sessions (policies.sql), with
-- their message counters (on Citus it counts what it deleted by them); of
-- messages, their ids (to count them), no content.
grant select (id, user_id, expires_at, message_count), update (expires_at), delete
  on public.chat_sessions to memchat_cleanup;
grant select (id, session_id, user_id) on public.chat_message_history to memchat_cleanup;

-- ======================================================= memchat's tables
revoke all on memchat.limits, memchat.notes_versions, memchat.rate_buckets,
  memchat.turn_claims, memchat.summary_queue, memchat.message_feedback
  from public;
revoke all on memchat.embedding_queue, memchat.message_embeddings, memchat.message_facts,
  memchat.message_facts_made, memchat.word_statistics, memchat.common_words,
  memchat.analytics_key, memchat.memories, memchat.forgotten_memories
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
grant select, delete on memchat.memories to memchat_user;
grant insert on memchat.forgotten_memories to memchat_user;

-- Expired claims and full buckets (policies.sql).
grant select (expires_at), delete on memchat.turn_claims to memchat_cleanup;
grant select (refilled_at), delete on memchat.rate_buckets to memchat_cleanup;
grant select (id, user_id, expires_at), delete on memchat.memories to memchat_cleanup;

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
  memchat.load_context(uuid, uuid, text, integer, boolean, text, text, double precision,
                       integer, double precision, integer),
  memchat.record_turn(uuid, uuid, text, text, jsonb, interval, text, text, integer, boolean,
                      extensions.vector, text, integer),
  memchat.chat_of_history(text, text[], text[], integer),
  memchat.lock_clear_target(uuid, text),
  memchat.begin_request(text, integer, integer, integer),
  memchat.current_user_exists(),
  memchat.take_rate_token(text, double precision, integer),
  memchat.throttle(text, double precision, integer),
  memchat.save_notes(uuid, text, text, integer),
  memchat.restore_notes(uuid, text, integer, integer),
  -- limits (functions/limits.sql)
  memchat.session_expiry(interval),
  memchat.stored_messages(),
  memchat.max_stored_messages(),
  memchat.hold_stored_messages(bigint),
  -- recall (functions/recall.sql, functions/words.sql)
  memchat.recall(uuid, uuid, text, integer, extensions.vector, text, text, integer,
                 double precision, double precision, timestamptz, timestamptz),
  memchat.recall_hits(bigint[], double precision[], uuid, bigint),
  memchat.nearest_message_ids(uuid, text, text, uuid, bigint, extensions.vector, integer,
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
  memchat.asked(jsonb),
  memchat.unembedded_messages(uuid, uuid, text),
  memchat.queue_embeddings(uuid[]),
  memchat.embedding_backlog(),
  -- stats, import (functions/stats.sql, functions/import.sql)
  memchat.chat_stats(uuid, text),
  memchat.session_stats(uuid, uuid),
  memchat.import_sessions(uuid, jsonb, jsonb, jsonb, interval, jsonb),
  -- memories (functions/memories.sql)
  memchat.search_memories(text, extensions.vector, text, text, integer, double precision,
                          boolean),
  memchat.recall_memories(uuid, text, extensions.vector, text, text, integer,
                          double precision),
  memchat.import_memories(uuid, jsonb, integer)
  to memchat_user;

-- The summary worker and the embedding backfill (`memchat_worker`): these
-- functions, nothing else (functions/summaries.sql, functions/embeddings.sql).
-- It also reads the column's size, to embed nothing that cannot be stored.
grant execute on function
  memchat.summary_claim(integer, double precision),
  memchat.summary_lag(),
  memchat.summary_source(uuid, integer, integer),
  memchat.summary_save(uuid, text, bigint, bigint),
  memchat.summary_remember(uuid, text, text, text),
  memchat.summary_done(uuid, integer),
  memchat.summary_failed(uuid, double precision),
  memchat.embedding_claim(integer, double precision),
  memchat.embedding_source(uuid, text, bigint, integer),
  memchat.embedding_save(uuid[], text, bigint[], text[]),
  memchat.facts_save(uuid[], bigint[], text, bigint[], integer[], text[]),
  memchat.memories_save(uuid[], text, bigint[], integer[], text[], text[], text[]),
  memchat.memory_embedding_source(bigint, integer),
  memchat.memory_embedding_save(bigint[], uuid[], text, text[]),
  memchat.embedding_done(uuid, text),
  memchat.embedding_failed(uuid, double precision),
  memchat.embedding_statistics(),
  memchat.embedding_dimensions()
  to memchat_worker;

-- Supabase's `service_role`.
grant execute on function memchat.current_user_exists(), memchat.save_notes(uuid, text, text, integer)
  to service_role;
