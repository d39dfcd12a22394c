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
alter table memchat.memories enable row level security;
alter table memchat.forgotten_memories enable row level security;
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

-- ------------------------------------------------------- memories
-- Written by the backfill (memchat.memories_save, as the owner); the caller
-- reads and deletes its own, and marks what it deleted as forgotten.
create policy memories_select on memchat.memories for select to memchat_user
  using (user_id = (select auth.uid()));
create policy memories_delete on memchat.memories for delete to memchat_user
  using (user_id = (select auth.uid()));
create policy forgotten_memories_insert on memchat.forgotten_memories
  for insert to memchat_user with check (user_id = (select auth.uid()));
-- The cleanup: those past their retention (tables/memories.sql).
create policy memories_cleanup_select on memchat.memories for select to memchat_cleanup
  using (expires_at <= now());
create policy memories_cleanup_delete on memchat.memories for delete to memchat_cleanup
  using (expires_at <= now());

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
