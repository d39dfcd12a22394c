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
create trigger chat_sessions_memories
  after delete on public.chat_sessions
  referencing old table as gone
  for each statement execute function memchat.keep_memories();

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
