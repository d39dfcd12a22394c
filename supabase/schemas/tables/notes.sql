-- Long-term notes, one text per (user, agent), and their earlier versions.
-- Row-level security, privileges: policies.sql, grants.sql; the triggers
-- (limit, versions): triggers.sql; writing them: functions/notes.sql.

-- `version` counts the writes: the optimistic check of memchat.save_notes.
create table public.agent_long_term_memory (
  id uuid not null default gen_random_uuid(),
  user_id uuid not null references auth.users (id) on delete cascade,
  agent_name text not null check (agent_name ~ '^[A-Za-z0-9_.-]{1,64}$'),
  notes text not null default '',
  version integer not null default 1 check (version >= 1),
  created_at timestamptz not null default now(),
  updated_at timestamptz not null default now(),
  primary key (id, user_id),
  unique (user_id, agent_name)
);

-- The last memchat.limits.notes_versions_kept versions of every (user,
-- agent)'s notes: an undo for the user (GET /memory/versions, POST
-- /memory/restore), e.g. after the model was talked into wiping them.
-- Written by a trigger as the table owner, so no role can forge history;
-- the caller reads its own; gone with the notes.
create table memchat.notes_versions (
  user_id uuid not null references auth.users (id) on delete cascade,
  agent_name text not null,
  version integer not null check (version >= 1),
  notes text not null,
  created_at timestamptz not null default now(),
  primary key (user_id, agent_name, version)
);
comment on table memchat.notes_versions is
  'Earlier versions of the long-term notes (trigger agent_long_term_memory_versions).';
