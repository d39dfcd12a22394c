-- A user's ratings of the answers they got. Row-level security, privileges:
-- policies.sql, grants.sql; the stats that read them: functions/stats.sql.
--
-- One rating (-1, 0, 1) and an optional comment per assistant answer, the
-- caller's own only. It goes with its message by the statement-level
-- triggers of triggers.sql (functions/cleanup.sql), not by a foreign key on
-- message_id: a foreign key acts per row, one more query per deleted
-- message, and the TTL cleanup deletes messages by the hundred thousand
-- (docs/benchmarks.md, "Scheduled cleanup"). A trigger does the foreign
-- key's check on insert (memchat.lock_referenced_message).
create table memchat.message_feedback (
  message_id bigint not null,
  user_id uuid not null default auth.uid() references auth.users (id) on delete cascade,
  session_id uuid not null,
  agent_name text not null,
  rating smallint not null check (rating in (-1, 0, 1)),
  comment text check (comment is null or char_length(comment) <= 2000),
  created_at timestamptz not null default now(),
  updated_at timestamptz not null default now(),
  primary key (message_id, user_id),
  constraint message_feedback_session_fkey
    foreign key (session_id, user_id) references public.chat_sessions (id, user_id)
    on delete cascade
);
comment on table memchat.message_feedback is
  'A user''s rating of one assistant answer: -1, 0 or 1, and an optional comment. '
  'Goes with its message (trigger chat_message_history_dependents).';
create index message_feedback_user_idx on memchat.message_feedback (user_id, agent_name);
create index message_feedback_session_idx on memchat.message_feedback (session_id);
