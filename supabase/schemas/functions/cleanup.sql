-- What goes with a deleted message: its embedding, fact keys and their
-- marker, its feedback, and the marks of the memories its user forgot
-- (tables/recall_keys.sql, tables/feedback.sql, tables/memories.sql),
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
  delete from memchat.forgotten_memories f where f.message_id = any(ids);
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
  truncate memchat.forgotten_memories;
  begin
    truncate memchat.message_feedback;
  exception when object_in_use then
    delete from memchat.message_feedback;
  end;
  return null;
end
$$;

-- The foreign key's check: the message, the row's user's own, exists, and
-- stays until this transaction ends. SQLSTATE 23503 (foreign_key_violation)
-- otherwise.
create function memchat.lock_referenced_message() returns trigger
language plpgsql security definer
set search_path = ''
as $$
begin
  -- By the message's whole key: on Citus a statement on one shard group.
  perform 1 from public.chat_message_history h
   where h.id = new.message_id and h.user_id = new.user_id
     for key share;
  if not found then
    raise exception using
      errcode = 'foreign_key_violation',
      message = format('%s: message %s does not exist', tg_table_name, new.message_id);
  end if;
  return null;
end
$$;
