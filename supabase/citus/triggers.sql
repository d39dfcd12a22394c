-- The triggers whose plain-PostgreSQL form reads a transition table (a
-- statement's deleted rows at once: supabase/schemas/triggers.sql), as row
-- triggers on Citus, where a query of a transition table next to a
-- distributed table cannot be planned ("unrecognized RTE kind") and a
-- trigger on a shard may read only its own node's shards: each deleted
-- row's dependents, by the row's own user_id, on the row's shard group.
-- Applied by `memchat db distribute` (memchat.store.distribute) after the
-- tables are distributed; re-runnable.

-- A message's embedding, fact keys, memories' marks and feedback go with
-- it (functions/cleanup.sql: memchat.delete_message_dependents).
create or replace function memchat.delete_row_dependents() returns trigger
language plpgsql security definer
set search_path = ''
as $$
begin
  delete from memchat.message_embeddings e
   where e.user_id = old.user_id and e.message_id = old.id;
  delete from memchat.message_facts f
   where f.user_id = old.user_id and f.message_id = old.id;
  delete from memchat.message_facts_made m
   where m.user_id = old.user_id and m.message_id = old.id;
  delete from memchat.forgotten_memories f
   where f.user_id = old.user_id and f.message_id = old.id;
  delete from memchat.message_feedback f
   where f.user_id = old.user_id and f.message_id = old.id;
  return null;
end
$$;
revoke all on function memchat.delete_row_dependents() from public;

-- A deleted session's memories: kept memchat.memory_retention_days past
-- its expiry, or deleted (functions/memories.sql: memchat.keep_memories).
create or replace function memchat.keep_row_memories() returns trigger
language plpgsql security definer
set search_path = ''
as $$
declare
  v_days integer := nullif(current_setting('memchat.memory_retention_days', true), '')::integer;
begin
  if v_days is null then
    delete from memchat.memories m
     where m.user_id = old.user_id and m.session_id = old.id and m.expires_at is null;
  else
    update memchat.memories m
       set expires_at = old.expires_at + make_interval(days => v_days)
     where m.user_id = old.user_id and m.session_id = old.id and m.expires_at is null;
  end if;
  return null;
end
$$;
revoke all on function memchat.keep_row_memories() from public;

drop trigger if exists chat_message_history_dependents on public.chat_message_history;
drop trigger if exists chat_message_history_truncate on public.chat_message_history;
drop trigger if exists chat_message_history_row_dependents on public.chat_message_history;
create trigger chat_message_history_row_dependents
  after delete on public.chat_message_history
  for each row execute function memchat.delete_row_dependents();

drop trigger if exists chat_sessions_memories on public.chat_sessions;
drop trigger if exists chat_sessions_row_memories on public.chat_sessions;
create trigger chat_sessions_row_memories
  after delete on public.chat_sessions
  for each row execute function memchat.keep_row_memories();
