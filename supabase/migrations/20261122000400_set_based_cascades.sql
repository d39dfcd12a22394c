-- A message's embedding and feedback go with it, a statement at a time.
--
-- Until now two foreign keys did it (message_embeddings.message_id and
-- message_feedback.message_id, `on delete cascade`). A foreign key acts per
-- row: every message deleted ran two more queries (one per referencing
-- table), found something or not, and the TTL cleanup deletes messages by
-- the hundred thousand. Measured (docs/benchmarks.md, "Scheduled cleanup"):
-- with an embedding per user message and a rating per twenty answers, the
-- cleanup deleted 125,722 messages/s flat out with the foreign keys and
-- 248,549 with the triggers below (1,000,000 messages, batch 1000).
--
-- What replaces them keeps what the foreign keys promised:
--
-- * Deletes: a statement-level trigger on chat_message_history (its deleted
--   rows as a transition table) deletes their embeddings and feedback in one
--   statement each, for every deleter: clear-session, DELETE /me and the
--   cleanup (through the session cascade), LangChain's clear(), the Data
--   API. Like a foreign key's cascade it runs as the tables' owner (security
--   definer, fixed search_path): it deletes only what belongs to messages
--   the caller was allowed to delete.
-- * Truncate: truncating chat_message_history truncates both tables too (a
--   foreign key would have refused a plain TRUNCATE).
-- * Inserts (and a changed message_id): a row-level trigger on both tables,
--   after the row (and so after its RLS check) as a foreign key's check is,
--   locks the message `for key share`, the lock that check takes, and
--   refuses a missing message with SQLSTATE 23503 (foreign_key_violation),
--   the foreign key's own error. So a rating and a concurrent delete of its
--   answer cannot leave a rating of nothing behind: the delete waits for the
--   rating's transaction and then deletes the rating, or the rating waits
--   for the delete and is refused.
--
-- The other cascades (sessions to messages, feedback and the summary queue;
-- users to sessions) act per session or per user, and stay foreign keys.

alter table memchat.message_embeddings
  drop constraint message_embeddings_message_id_fkey;
alter table memchat.message_feedback
  drop constraint message_feedback_message_id_fkey;

-- Deletes what belonged to the messages a statement deleted.
create function memchat.delete_message_dependents() returns trigger
language plpgsql security definer
set search_path = ''
as $$
declare
  -- As an array, so each delete is a primary-key lookup per id whatever the
  -- statement's size (a transition table has no statistics to plan a join by).
  ids bigint[] := array(select g.id from gone g);
begin
  delete from memchat.message_embeddings e where e.message_id = any(ids);
  delete from memchat.message_feedback f where f.message_id = any(ids);
  return null;
end
$$;
revoke all on function memchat.delete_message_dependents() from public;

create trigger chat_message_history_dependents
  after delete on public.chat_message_history
  referencing old table as gone
  for each statement execute function memchat.delete_message_dependents();

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
    truncate memchat.message_feedback;
  exception when object_in_use then
    delete from memchat.message_feedback;
  end;
  return null;
end
$$;
revoke all on function memchat.truncate_message_dependents() from public;

create trigger chat_message_history_truncate
  after truncate on public.chat_message_history
  for each statement execute function memchat.truncate_message_dependents();

-- The foreign key's check: the message exists, and stays until this
-- transaction ends.
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
revoke all on function memchat.lock_referenced_message() from public;

create trigger message_embeddings_message
  after insert or update of message_id on memchat.message_embeddings
  for each row execute function memchat.lock_referenced_message();
create trigger message_feedback_message
  after insert or update of message_id on memchat.message_feedback
  for each row execute function memchat.lock_referenced_message();

-- Dependents a lost race could have left behind before this migration cannot
-- exist (the foreign keys were there until now); nothing to clean up.

comment on table memchat.message_embeddings is
  'The embedding of each stored user message, for recall. Goes with its message '
  '(trigger chat_message_history_dependents).';
comment on table memchat.message_feedback is
  'A user''s rating of one assistant answer: -1, 0 or 1, and an optional comment. '
  'Goes with its message (trigger chat_message_history_dependents).';
