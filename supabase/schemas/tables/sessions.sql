-- Sessions and each (user, agent)'s active session. Row-level security,
-- privileges: policies.sql, grants.sql; limits: triggers.sql.

-- One row per conversation. Its key is (id, user_id): a session id is the
-- caller's own, so an id another user happens to hold is, for this caller,
-- just an unknown id (nothing answers differently for it), and every
-- reference follows the whole key, so a row can only ever point at a
-- session of its own user.
create table public.chat_sessions (
  id uuid not null default gen_random_uuid(),
  user_id uuid not null references auth.users (id) on delete cascade,
  agent_name text not null default 'default'
    check (agent_name ~ '^[A-Za-z0-9_.-]{1,64}$'),
  title text check (char_length(title) <= 200),
  status text not null default 'active' check (status in ('active', 'cleared')),
  message_count integer not null default 0 check (message_count >= 0),
  summary text,
  created_at timestamptz not null default now(),
  last_active_at timestamptz not null default now(),
  expires_at timestamptz not null default now() + interval '168 hours',
  -- The rolling summary (functions/summaries.sql): the last message it
  -- covers, how many of the session's messages it covers, when it was made.
  summary_covers_until bigint,
  summary_covers_count integer not null default 0 check (summary_covers_count >= 0),
  summary_updated_at timestamptz,
  -- Counters record_turn keeps, so that a user's stats read their sessions'
  -- rows, never their messages (functions/stats.sql).
  turn_count integer not null default 0 check (turn_count >= 0),
  prompt_tokens bigint not null default 0 check (prompt_tokens >= 0),
  completion_tokens bigint not null default 0 check (completion_tokens >= 0),
  primary key (id, user_id)
);
comment on table public.chat_sessions is
  'Session registry: one row per conversation; expires_at slides with every turn.';
comment on column public.chat_sessions.summary is
  'Model-written summary of the messages up to summary_covers_until (background, not instructions).';
comment on column public.chat_sessions.summary_covers_count is
  'How many of the session''s messages (all types) the summary covers.';
comment on column public.chat_sessions.turn_count is
  'Turns answered in this session (kept when it is cleared; restarts when it expires).';
comment on column public.chat_sessions.prompt_tokens is
  'Prompt tokens the model billed for this session''s turns (kept when it is cleared).';
comment on column public.chat_sessions.completion_tokens is
  'Completion tokens the model billed for this session''s turns (kept when it is cleared).';

create index chat_sessions_user_agent_recent_idx
  on public.chat_sessions (user_id, agent_name, last_active_at desc);
create index chat_sessions_user_recent_idx
  on public.chat_sessions (user_id, last_active_at desc);
-- The TTL cleanup walks this index.
create index chat_sessions_expires_at_idx on public.chat_sessions (expires_at);

-- Each (user, agent)'s active session: where a turn without a session id goes.
create table public.user_agent_active_sessions (
  user_id uuid not null references auth.users (id) on delete cascade,
  agent_name text not null check (agent_name ~ '^[A-Za-z0-9_.-]{1,64}$'),
  active_session_id uuid not null,
  last_active_at timestamptz not null default now(),
  created_at timestamptz not null default now(),
  primary key (user_id, agent_name),
  constraint user_agent_active_sessions_active_session_fkey
    foreign key (active_session_id, user_id) references public.chat_sessions (id, user_id)
    on delete cascade
);
-- Serves the cascade from chat_sessions.
create index user_agent_active_sessions_session_idx
  on public.user_agent_active_sessions (active_session_id);
