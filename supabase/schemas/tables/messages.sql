-- Every stored message. Row-level security, privileges: policies.sql,
-- grants.sql; the triggers (user_id filled in, limits, dependents):
-- triggers.sql.

-- Same core columns as langchain_postgres.PostgresChatMessageHistory, so
-- its get_messages() reads this table as it is. Ids are always generated:
-- an explicit id is refused, and the API's role may insert every column
-- but the id (grants.sql), so no writer picks future ids (the table owner
-- still may, e.g. to restore a dump).
create table public.chat_message_history (
  id bigint generated always as identity,
  session_id uuid not null,
  user_id uuid not null references auth.users (id) on delete cascade,
  message jsonb not null,
  client_message_id text check (char_length(client_message_id) between 1 and 128),
  created_at timestamptz not null default now(),
  -- Every key holds its user (a distributed table's must: docs/deploy.md,
  -- "Citus"); a message is found by its id alone as well (the leading column).
  primary key (id, user_id),
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
