-- The policies whose checks hold a subquery, in the form Citus accepts on a
-- distributed table ("Subqueries are not supported in policies on
-- distributed tables"), applied by `memchat db distribute` before it
-- distributes the tables (memchat.store.distribute). Every other policy
-- differs from supabase/schemas/policies.sql only in `(select auth.uid())`
-- read as `auth.uid()`, which `distribute` rewrites itself.
--
-- What each subquery checked is held here by the composite foreign key the
-- table has: a row's (session_id, user_id) names a session of its own user,
-- which `user_id = auth.uid()` makes the caller's; a message's dependents
-- name their message by (message_id, user_id) in
-- memchat.lock_referenced_message().

alter policy active_sessions_insert on public.user_agent_active_sessions
  with check (user_id = auth.uid());
alter policy active_sessions_update on public.user_agent_active_sessions
  with check (user_id = auth.uid());
alter policy messages_insert on public.chat_message_history
  with check (user_id = auth.uid());
alter policy summary_queue_own on memchat.summary_queue
  with check (user_id = auth.uid());
alter policy embedding_queue_own on memchat.embedding_queue
  with check (user_id = auth.uid());
alter policy message_feedback_own on memchat.message_feedback
  with check (user_id = auth.uid());
alter policy message_embeddings_insert on memchat.message_embeddings
  with check (user_id = auth.uid());

-- `memchat cleanup --dry-run` counts expired sessions' messages through this
-- one on plain PostgreSQL; on Citus the cleanup reads no message rows.
drop policy if exists messages_cleanup_count on public.chat_message_history;
