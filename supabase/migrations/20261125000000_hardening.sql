-- Hardening (issue 20): what a security review found, attacking memchat from
-- outside and logging in as each of its roles.
--
-- * Session ids are the caller's own: chat_sessions' key is (id, user_id),
--   so a session id another user happens to hold is, for this caller, just
--   an unknown id. Nothing answers differently for it (no oracle for other
--   users' ids), and memchat.session_id_taken is gone.
-- * Throttles per (user, bucket) in memchat.rate_buckets, for every write and
--   expensive read, not only chat; DELETE /me no longer resets them.
-- * The summary worker (`memchat_worker`) is no longer a member of
--   `memchat_user`: it can act only on what the queue hands it, through
--   SECURITY DEFINER functions that take the lease of a claimed queue item.
-- * The summary queue's rows must be of the caller's own sessions.
-- * Message ids are always generated (a writer cannot pick future ids).
-- * `anon` and `authenticated` lose the sequence rights Supabase's default
--   privileges give them (setval on the message ids).
-- * The cleanup reads the message ids of expired sessions only.
-- * Statement and idle-in-transaction timeouts on the login roles.
-- * Long-term notes keep their last versions (undo), written by a trigger.
-- docs/deploy.md ("Roles") states what each role may do; a test compares
-- that statement with the catalog.

-- ======================================================= per-user session ids
-- The composite key replaces the global one; every reference follows it, so
-- a row can only ever point at a session of its own user.
alter table public.user_agent_active_sessions
  drop constraint user_agent_active_sessions_active_session_id_fkey;
alter table public.chat_message_history
  drop constraint chat_message_history_session_id_fkey;
alter table memchat.summary_queue
  drop constraint summary_queue_session_id_fkey;
alter table memchat.message_feedback
  drop constraint message_feedback_session_id_fkey;

alter table public.chat_sessions drop constraint chat_sessions_pkey;
alter table public.chat_sessions add primary key (id, user_id);

alter table public.user_agent_active_sessions
  add constraint user_agent_active_sessions_active_session_fkey
  foreign key (active_session_id, user_id) references public.chat_sessions (id, user_id)
  on delete cascade;
alter table public.chat_message_history
  add constraint chat_message_history_session_fkey
  foreign key (session_id, user_id) references public.chat_sessions (id, user_id)
  on delete cascade;
alter table memchat.message_feedback
  add constraint message_feedback_session_fkey
  foreign key (session_id, user_id) references public.chat_sessions (id, user_id)
  on delete cascade;

-- The same client_message_id in two users' sessions of the same id are two keys.
drop index public.chat_message_history_client_message_idx;
create unique index chat_message_history_client_message_idx
  on public.chat_message_history (user_id, session_id, client_message_id)
  where client_message_id is not null;

drop function memchat.session_id_taken(uuid);

-- Fills user_id from the session when an insert leaves it out (LangChain's
-- add_messages does): the caller's own session of that id.
create or replace function memchat.fill_message_user_id() returns trigger
language plpgsql
set search_path = ''
as $$
begin
  if new.user_id is null then
    select s.user_id into new.user_id from public.chat_sessions s
     where s.id = new.session_id
     order by s.user_id = (select auth.uid()) desc nulls last
     limit 1;
  end if;
  return new;
end
$$;

-- ======================================================= message ids
-- ALWAYS: an explicit id is refused. OVERRIDING SYSTEM VALUE would still let
-- any inserter pick one, so the API's role may insert every column but the
-- id (the table owner still may, e.g. to restore a dump).
alter table public.chat_message_history alter column id set generated always;
revoke insert on public.chat_message_history from memchat_user;
grant insert (session_id, user_id, message, client_message_id, created_at)
  on public.chat_message_history to memchat_user;

-- ======================================================= the Data API's roles
-- Supabase's default privileges grant `anon` and `authenticated` everything
-- on new sequences in `public` (infra/bootstrap.sql does the same locally):
-- `select setval(...)` through the Data API would move the message ids.
revoke all on all sequences in schema public from anon, authenticated, public;

-- ======================================================= throttles
-- A token bucket per (user, bucket): refilled continuously at the bucket's
-- rate, capped at its burst; each throttled request takes one token. The
-- rates are the API's settings (memchat/throttle.py says which request uses
-- which bucket). Kept when the user's data is deleted (DELETE /me), so
-- deleting cannot reset a throttle; gone with the user (auth.users).
create table memchat.rate_buckets (
  user_id uuid not null references auth.users (id) on delete cascade,
  bucket text not null check (bucket ~ '^[a-z_]{1,32}$'),
  tokens double precision not null,
  refilled_at timestamptz not null,
  primary key (user_id, bucket)
);
comment on table memchat.rate_buckets is
  'Per-user throttles (token buckets), one row per (user, bucket). Outlive DELETE /me.';
alter table memchat.rate_buckets enable row level security;
revoke all on memchat.rate_buckets from public;
grant select, insert, update on memchat.rate_buckets to memchat_user;
create policy rate_buckets_own on memchat.rate_buckets for all to memchat_user
  using (user_id = (select auth.uid())) with check (user_id = (select auth.uid()));
-- A bucket untouched for a day is full again for any sane rate: the cleanup
-- deletes it (it would be re-created full).
grant select (refilled_at), delete on memchat.rate_buckets to memchat_cleanup;
create policy rate_buckets_cleanup_select on memchat.rate_buckets
  for select to memchat_cleanup using (refilled_at < now() - interval '1 day');
create policy rate_buckets_cleanup_delete on memchat.rate_buckets
  for delete to memchat_cleanup using (refilled_at < now() - interval '1 day');

insert into memchat.rate_buckets (user_id, bucket, tokens, refilled_at)
select r.user_id, 'chat', r.tokens, r.refilled_at from memchat.chat_rate r;

-- Takes a token from the caller's bucket; returns 0 if it got one, else the
-- seconds until one is available (and takes nothing). Concurrent requests of
-- one user queue on the bucket's row for the rest of their transaction.
create function memchat.take_rate_token(
  p_bucket text, p_per_minute double precision, p_burst integer
) returns double precision
language plpgsql
set search_path = ''
as $$
declare
  v_uid uuid := auth.uid();
  v_level double precision;
begin
  if p_per_minute <= 0 or not memchat.current_user_exists() then
    -- A deleted user's request is refused anyway (its transaction's
    -- existence check); it keeps no bucket.
    return 0;
  end if;
  insert into memchat.rate_buckets (user_id, bucket, tokens, refilled_at)
  values (v_uid, p_bucket, p_burst, now())
  on conflict (user_id, bucket) do nothing;
  select least(p_burst::double precision,
               r.tokens + greatest(0, extract(epoch from now() - r.refilled_at))
                          * p_per_minute / 60)
    into v_level
    from memchat.rate_buckets r where r.user_id = v_uid and r.bucket = p_bucket
     for update;
  if v_level < 1 then
    return (1 - v_level) * 60 / p_per_minute;
  end if;
  update memchat.rate_buckets r
     set tokens = v_level - 1, refilled_at = greatest(r.refilled_at, now())
   where r.user_id = v_uid and r.bucket = p_bucket;
  return 0;
end
$$;

-- take_rate_token for any request's transaction: out of tokens raises
-- SQLSTATE MC429 (DETAIL: the seconds to wait), so the request's other
-- statements, sent in the same pipeline, never run.
create function memchat.throttle(p_bucket text, p_per_minute double precision, p_burst integer)
returns void
language plpgsql
set search_path = ''
as $$
declare
  v_retry double precision := memchat.take_rate_token(p_bucket, p_per_minute, p_burst);
begin
  if v_retry > 0 then
    raise exception 'rate limited (%)', p_bucket
      using errcode = 'MC429', detail = v_retry::text;
  end if;
end
$$;

drop function memchat.take_chat_token(double precision, integer);
drop table memchat.chat_rate;

revoke all on function memchat.take_rate_token(text, double precision, integer),
  memchat.throttle(text, double precision, integer) from public;
grant execute on function memchat.take_rate_token(text, double precision, integer),
  memchat.throttle(text, double precision, integer) to memchat_user;

-- ======================================================= the summary queue
alter table memchat.summary_queue drop constraint summary_queue_pkey;
alter table memchat.summary_queue add primary key (session_id, user_id);
alter table memchat.summary_queue
  add constraint summary_queue_session_fkey
  foreign key (session_id, user_id) references public.chat_sessions (id, user_id)
  on delete cascade;
-- A claim's lease: the token the worker's functions take. Only a claimed,
-- unexpired item can be read or written by the worker.
alter table memchat.summary_queue add column lease uuid;
create unique index summary_queue_lease_idx on memchat.summary_queue (lease)
  where lease is not null;

-- The caller's own sessions only (the foreign key says the same).
drop policy summary_queue_own on memchat.summary_queue;
create policy summary_queue_own on memchat.summary_queue for all to memchat_user
  using (user_id = (select auth.uid()))
  with check (user_id = (select auth.uid()) and exists (
    select 1 from public.chat_sessions s
     where s.id = summary_queue.session_id and s.user_id = (select auth.uid())));

-- ======================================================= the summary worker
-- Until now the worker could `set role memchat_user` with any claims. It
-- keeps its login and these functions, nothing else.
revoke memchat_user from memchat_worker;
drop policy summary_queue_worker_select on memchat.summary_queue;
drop policy summary_queue_worker_update on memchat.summary_queue;
revoke all on memchat.summary_queue from memchat_worker;
drop function memchat.summary_source(uuid, integer, integer);
drop function memchat.save_summary(uuid, text, bigint, bigint, integer);
drop function memchat.settle_summary(uuid, integer);

-- Lease up to p_limit due items for p_lease_seconds (FOR UPDATE SKIP LOCKED:
-- another worker skips them): [{"lease", "session_id", "attempts"}]. The
-- owner's id stays in the database.
create function memchat.summary_claim(p_limit integer, p_lease_seconds double precision)
returns jsonb
language sql
security definer
set search_path = ''
as $$
  with due as (
    select d.session_id, d.user_id from memchat.summary_queue d
     where d.next_attempt_at <= now()
     order by d.next_attempt_at
     limit p_limit
       for update skip locked
  ), leased as (
    update memchat.summary_queue q
       set next_attempt_at = now() + make_interval(secs => p_lease_seconds),
           lease = gen_random_uuid()
      from due
     where q.session_id = due.session_id and q.user_id = due.user_id
    returning q.lease, q.session_id, q.attempts
  )
  select coalesce(jsonb_agg(jsonb_build_object(
           'lease', l.lease, 'session_id', l.session_id, 'attempts', l.attempts)), '[]'::jsonb)
    from leased l
$$;

-- Seconds the oldest due item has been waiting (null: none is due).
create function memchat.summary_lag() returns double precision
language sql stable
security definer
set search_path = ''
as $$
  select extract(epoch from now() - min(q.due_since))::double precision
    from memchat.summary_queue q where q.next_attempt_at <> 'infinity'
$$;

-- The queue item a live lease holds (no row: expired, taken over, or never).
create function memchat.summary_leased(p_lease uuid) returns memchat.summary_queue
language sql stable
security definer
set search_path = ''
as $$
  select q.* from memchat.summary_queue q
   where q.lease = p_lease and q.next_attempt_at > now()
$$;

-- What one refresh of a leased item summarizes: its summary so far and the
-- conversational messages after it that have left the window of p_window
-- (at most p_chunk, oldest first), as {"summary", "covers_until",
-- "messages": [{"id", "type", "content"}], "boundary"}; null when there is
-- nothing (left) to summarize or the lease is not live. Only that session,
-- only its owner's rows.
create function memchat.summary_source(p_lease uuid, p_window integer, p_chunk integer)
returns jsonb
language plpgsql stable
security definer
set search_path = ''
as $$
declare
  v_item memchat.summary_queue := memchat.summary_leased(p_lease);
  v_session public.chat_sessions;
  v_floor bigint;
  v_messages jsonb;
  v_last bigint;
begin
  if v_item.session_id is null then
    return null;
  end if;
  select s.* into v_session from public.chat_sessions s
   where s.id = v_item.session_id and s.user_id = v_item.user_id
     and s.status = 'active' and s.expires_at > now();
  if v_session.id is null then
    return null;
  end if;
  -- The window's oldest message: only what is older has left the window.
  select min(w.id) into v_floor
    from (select h.id from public.chat_message_history h
           where h.user_id = v_item.user_id and h.session_id = v_item.session_id
             and h.message->>'type' <> 'tool'
             and coalesce(jsonb_array_length(h.message->'data'->'tool_calls'), 0) = 0
           order by h.id desc
           limit p_window) w;
  select coalesce(jsonb_agg(jsonb_build_object(
           'id', m.id, 'type', m.message->>'type',
           'content', left(m.message->'data'->>'content', 4000)) order by m.id), '[]'::jsonb),
         max(m.id)
    into v_messages, v_last
    from (select h.id, h.message from public.chat_message_history h
           where h.user_id = v_item.user_id and h.session_id = v_item.session_id
             and h.id > coalesce(v_session.summary_covers_until, 0)
             and h.id < coalesce(v_floor, 0)
             and h.message->>'type' <> 'tool'
             and coalesce(jsonb_array_length(h.message->'data'->'tool_calls'), 0) = 0
           order by h.id
           limit p_chunk) m;
  if v_last is null then
    return null;
  end if;
  return jsonb_build_object(
    'summary', v_session.summary,
    'covers_until', v_session.summary_covers_until,
    'messages', v_messages,
    'boundary', v_last);
end
$$;

-- Store a refreshed summary of a leased item covering messages up to
-- p_covers_until, if the session still has the summary it was made from
-- (p_expected: its covers_until then) and still holds that message (a clear
-- in between deleted it). The item stays leased. Returns whether it was stored.
create function memchat.summary_save(
  p_lease uuid, p_summary text, p_covers_until bigint, p_expected bigint
) returns boolean
language plpgsql
security definer
set search_path = ''
as $$
declare
  v_item memchat.summary_queue := memchat.summary_leased(p_lease);
  v_newly integer;
  v_stored uuid;
begin
  if v_item.session_id is null then
    return false;
  end if;
  select count(*) into v_newly from public.chat_message_history h
   where h.user_id = v_item.user_id and h.session_id = v_item.session_id
     and h.id > coalesce(p_expected, 0) and h.id <= p_covers_until;
  update public.chat_sessions s
     set summary = p_summary,
         summary_covers_until = p_covers_until,
         summary_covers_count = s.summary_covers_count + v_newly,
         summary_updated_at = now()
   where s.id = v_item.session_id and s.user_id = v_item.user_id and s.status = 'active'
     and s.summary_covers_until is not distinct from p_expected
     and exists (select 1 from public.chat_message_history h
                  where h.user_id = v_item.user_id and h.session_id = v_item.session_id
                    and h.id = p_covers_until)
  returning s.id into v_stored;
  return v_stored is not null;
end
$$;

-- The end of a leased item's pass: it stays queued (ready now, attempts
-- reset) while p_due_after or more of its messages are outside its summary
-- (new turns meanwhile), else it leaves the queue.
create function memchat.summary_done(p_lease uuid, p_due_after integer) returns void
language plpgsql
security definer
set search_path = ''
as $$
declare
  v_item memchat.summary_queue := memchat.summary_leased(p_lease);
begin
  if v_item.session_id is null then
    return;
  end if;
  if exists (
       select 1 from public.chat_sessions s
        where s.id = v_item.session_id and s.user_id = v_item.user_id and s.status = 'active'
          and s.message_count - s.summary_covers_count >= p_due_after) then
    update memchat.summary_queue q set attempts = 0, next_attempt_at = now(), lease = null
     where q.lease = p_lease;
  else
    delete from memchat.summary_queue q where q.lease = p_lease;
  end if;
end
$$;

-- A leased item's refresh failed: retry in p_retry_in seconds (null: not
-- until the session's next turn queues it again). Returns the failures in a row.
create function memchat.summary_failed(p_lease uuid, p_retry_in double precision)
returns integer
language sql
security definer
set search_path = ''
as $$
  update memchat.summary_queue q
     set attempts = q.attempts + 1,
         lease = null,
         next_attempt_at = case when p_retry_in is null then 'infinity'::timestamptz
                                else now() + make_interval(secs => p_retry_in) end
   where q.lease = p_lease and q.next_attempt_at > now()
  returning q.attempts
$$;

revoke all on function memchat.summary_claim(integer, double precision),
  memchat.summary_lag(), memchat.summary_leased(uuid),
  memchat.summary_source(uuid, integer, integer),
  memchat.summary_save(uuid, text, bigint, bigint),
  memchat.summary_done(uuid, integer),
  memchat.summary_failed(uuid, double precision) from public;
grant execute on function memchat.summary_claim(integer, double precision),
  memchat.summary_lag(),
  memchat.summary_source(uuid, integer, integer),
  memchat.summary_save(uuid, text, bigint, bigint),
  memchat.summary_done(uuid, integer),
  memchat.summary_failed(uuid, double precision) to memchat_worker;

-- ======================================================= the cleanup
-- It counts the messages it deletes without reading them: the trigger that
-- deletes their dependents adds up, per transaction, how many messages went
-- (memchat.deleted_messages), whoever deleted them.
create or replace function memchat.delete_message_dependents() returns trigger
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
  perform set_config('memchat.deleted_messages',
    (coalesce(nullif(current_setting('memchat.deleted_messages', true), ''), '0')::bigint
     + cardinality(ids))::text, true);
  return null;
end
$$;

-- Of messages, it may read the ids of expired sessions' only (`memchat cleanup
-- --dry-run` counts them).
drop policy messages_cleanup_count on public.chat_message_history;
grant select (user_id) on public.chat_sessions to memchat_cleanup;
grant select (user_id) on public.chat_message_history to memchat_cleanup;
create policy messages_cleanup_count on public.chat_message_history
  for select to memchat_cleanup using (exists (
    select 1 from public.chat_sessions s
     where s.id = chat_message_history.session_id
       and s.user_id = chat_message_history.user_id
       and s.expires_at <= now()));

-- ======================================================= timeouts
-- What one statement or one open transaction may hold at most, whatever the
-- code does. The API also sets its own (DB_STATEMENT_TIMEOUT_MS,
-- DB_IDLE_IN_TRANSACTION_TIMEOUT_MS) in every request's transaction; these
-- are the floor under a code path that forgets. Through Supavisor, role
-- settings apply to the server connections it opens as the role.
alter role memchat_api set statement_timeout = '30s';
alter role memchat_api set idle_in_transaction_session_timeout = '60s';
alter role memchat_worker set statement_timeout = '30s';
alter role memchat_worker set idle_in_transaction_session_timeout = '60s';
-- The cleanup's batches are bounded by CLEANUP_BATCH_SIZE and lock_timeout.
alter role memchat_cleanup set statement_timeout = '120s';
alter role memchat_cleanup set idle_in_transaction_session_timeout = '60s';

-- ======================================================= notes versions
-- Every version of every (user, agent)'s notes, the last
-- memchat.limits.notes_versions_kept of them: an undo for the user (GET
-- /memory/versions, POST /memory/restore), e.g. after the model was talked
-- into wiping them. Written by a trigger as the table owner, so no role can
-- forge history; the caller reads its own; gone with the notes.
alter table memchat.limits
  add column notes_versions_kept integer not null default 20
    check (notes_versions_kept between 1 and 1000);

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
alter table memchat.notes_versions enable row level security;
revoke all on memchat.notes_versions from public;
grant select on memchat.notes_versions to memchat_user;
create policy notes_versions_own on memchat.notes_versions for select to memchat_user
  using (user_id = (select auth.uid()));

create function memchat.keep_notes_version() returns trigger
language plpgsql
security definer
set search_path = ''
as $$
begin
  if tg_op = 'DELETE' then
    delete from memchat.notes_versions v
     where v.user_id = old.user_id and v.agent_name = old.agent_name;
    return null;
  end if;
  insert into memchat.notes_versions (user_id, agent_name, version, notes, created_at)
  values (new.user_id, new.agent_name, new.version, new.notes, new.updated_at)
  on conflict (user_id, agent_name, version) do update
     set notes = excluded.notes, created_at = excluded.created_at;
  delete from memchat.notes_versions v
   where v.user_id = new.user_id and v.agent_name = new.agent_name
     and v.version <= new.version - (select l.notes_versions_kept from memchat.limits l);
  return null;
end
$$;
revoke all on function memchat.keep_notes_version() from public;

create trigger agent_long_term_memory_versions
  after insert or update of notes, version or delete on public.agent_long_term_memory
  for each row execute function memchat.keep_notes_version();

insert into memchat.notes_versions (user_id, agent_name, version, notes, created_at)
select m.user_id, m.agent_name, m.version, m.notes, m.updated_at
  from public.agent_long_term_memory m;

-- The caller's notes of an agent set back to an earlier version's text (a
-- new version; p_expected_version as in memchat.save_notes). Null when there
-- is no such version.
create function memchat.restore_notes(
  p_agent_name text, p_version integer, p_expected_version integer
) returns integer
language plpgsql
set search_path = ''
as $$
declare
  v_notes text;
begin
  select v.notes into v_notes from memchat.notes_versions v
   where v.user_id = (select auth.uid()) and v.agent_name = p_agent_name
     and v.version = p_version;
  if not found then
    return null;
  end if;
  return memchat.save_notes(p_agent_name, v_notes, p_expected_version);
end
$$;
revoke all on function memchat.restore_notes(text, integer, integer) from public;
grant execute on function memchat.restore_notes(text, integer, integer) to memchat_user;

-- ======================================================= the turn
-- load_context, as before, with:
-- * the session the caller's own by id (no "taken": another user's id is
--   an unknown id to this caller);
-- * the throttle from memchat.rate_buckets (bucket 'chat');
-- * the window reaching back to the summary: the messages the summary does
--   not cover yet stay in the window (at most p_read_max of them), so
--   a summary is usable between refreshes, not only right after one. Only
--   when even p_read_max messages do not reach it back (the worker is
--   behind) is it left out, as a hole would make it misleading.
drop function memchat.load_context(uuid, text, integer, boolean, text, text, double precision,
                                   integer, double precision);

create function memchat.load_context(
  p_session_id uuid,
  p_agent_name text,
  p_window integer,
  p_read_notes boolean,
  p_client_message_id text,
  p_message text,
  p_rate_per_minute double precision,
  p_rate_burst integer,
  p_claim_seconds double precision,
  p_read_max integer
) returns jsonb
language plpgsql
set search_path = ''
set enable_bitmapscan = off
as $$
declare
  v_uid uuid := auth.uid();
  v_session public.chat_sessions;
  v_session_json jsonb;
  v_notes jsonb;
  v_messages jsonb := '[]'::jsonb;
  v_summary jsonb;
  v_stored text;
  v_replay jsonb;
  v_same boolean;
  v_retry double precision;
  v_digest bytea;
  v_with_summary boolean;
  v_read integer;
  v_recent record;
  v_ids bigint[] := '{}';
  v_bodies jsonb[] := '{}';
  v_keep integer;
begin
  if p_session_id is not null then
    select s.* into v_session from public.chat_sessions s
     where s.id = p_session_id and s.user_id = v_uid;
  else
    select s.* into v_session
      from public.user_agent_active_sessions a
      join public.chat_sessions s on s.id = a.active_session_id and s.user_id = a.user_id
     where a.user_id = v_uid and a.agent_name = p_agent_name
       and s.status = 'active' and s.expires_at > now();
  end if;
  if v_session.id is not null then
    v_session_json := to_jsonb(v_session)
      || jsonb_build_object('expired', v_session.expires_at <= now());
  end if;

  if p_client_message_id is not null then
    if v_session.id is not null then
      select u.message->'data'->>'content',
             case when a.id is not null then jsonb_build_object(
               'message', a.message, 'message_id', a.id, 'user_message_id', u.id) end
        into v_stored, v_replay
        from public.chat_message_history u
        left join lateral (
             select x.id, x.message from public.chat_message_history x
              where x.user_id = v_uid and x.session_id = u.session_id and x.id > u.id
                and x.message->>'type' = 'ai'
                and coalesce(jsonb_array_length(x.message->'data'->'tool_calls'), 0) = 0
              order by x.id limit 1) a on true
       where u.user_id = v_uid and u.session_id = v_session.id
         and u.client_message_id = p_client_message_id;
      if found then
        if v_stored is distinct from p_message then
          return jsonb_build_object('idempotency', 'conflict');
        end if;
        if v_replay is not null then
          return jsonb_build_object('taken', false, 'session', v_session_json,
                                    'replay', v_replay);
        end if;
      end if;
    end if;
    v_digest := sha256(convert_to(coalesce(p_message, ''), 'UTF8'));
    select c.message_digest = v_digest into v_same
      from memchat.turn_claims c
     where c.user_id = v_uid and c.client_message_id = p_client_message_id
       and c.expires_at > now();
    if found then
      return jsonb_build_object('idempotency', case when v_same then 'in_flight' else 'conflict' end);
    end if;
  end if;

  if p_rate_per_minute > 0 or p_client_message_id is not null then
    -- What this transaction writes (a throttle token, a turn claim) may be
    -- lost in a server crash without harm, so its commit does not wait for
    -- the WAL flush: the turn's first round trip stays a read's.
    perform set_config('synchronous_commit', 'off', true);
  end if;

  if p_rate_per_minute > 0 then
    v_retry := memchat.take_rate_token('chat', p_rate_per_minute, p_rate_burst);
    if v_retry > 0 then
      return jsonb_build_object('throttled', v_retry);
    end if;
  end if;

  if p_client_message_id is not null then
    insert into memchat.turn_claims as c (user_id, client_message_id, message_digest, expires_at)
    values (v_uid, p_client_message_id, v_digest,
            now() + make_interval(secs => p_claim_seconds))
    on conflict (user_id, client_message_id) do update
       set message_digest = excluded.message_digest, expires_at = excluded.expires_at
     where c.expires_at <= now()
    returning true into v_same;
    if v_same is null then
      -- A concurrent request claimed it first (its row was not yet visible).
      return jsonb_build_object('idempotency', 'in_flight');
    end if;
  end if;

  if p_read_notes then
    select jsonb_build_object('notes', m.notes, 'version', m.version, 'updated_at', m.updated_at)
      into v_notes
      from public.agent_long_term_memory m
     where m.user_id = v_uid and m.agent_name = coalesce(v_session.agent_name, p_agent_name);
  end if;

  if v_session.id is not null and v_session.expires_at > now() then
    v_with_summary := v_session.summary is not null and p_read_notes;
    -- With a summary, one more than the most it may keep: the message the
    -- summary ends with, which shows that nothing lies between.
    v_read := case when v_with_summary then greatest(p_window, p_read_max) + 1 else p_window end;
    -- Walks chat_message_history_window_idx and stops after v_read entries.
    for v_recent in
      select h.id, h.message from public.chat_message_history h
       where h.user_id = v_uid and h.session_id = v_session.id
         and h.message->>'type' <> 'tool'
         and coalesce(jsonb_array_length(h.message->'data'->'tool_calls'), 0) = 0
       order by h.id desc
       limit v_read
    loop
      v_ids := v_ids || v_recent.id;
      v_bodies := v_bodies || v_recent.message;
    end loop;
    v_keep := least(p_window, cardinality(v_ids));
    -- The summary is usable when what was read reaches back to it (or is
    -- the whole session): then every message after it is in the window.
    if v_with_summary and (cardinality(v_ids) < v_read
                           or v_ids[cardinality(v_ids)] <= v_session.summary_covers_until) then
      while v_keep < cardinality(v_ids) and v_ids[v_keep + 1] > v_session.summary_covers_until loop
        v_keep := v_keep + 1;
      end loop;
      v_summary := jsonb_build_object(
        'text', v_session.summary,
        'covers_until', v_session.summary_covers_until,
        'updated_at', v_session.summary_updated_at);
    end if;
    select coalesce(jsonb_agg(b.body order by b.ord desc), '[]'::jsonb) into v_messages
      from unnest(v_bodies[1:v_keep]) with ordinality as b(body, ord);
  end if;

  return jsonb_build_object(
    'taken', false,
    'session', v_session_json,
    'notes', v_notes,
    'messages', v_messages,
    'summary', v_summary,
    'replay', null,
    'claimed', p_client_message_id is not null,
    'limits', (select jsonb_build_object(
                 'max_message_chars', l.max_message_chars,
                 'max_notes_chars', l.max_notes_chars,
                 'max_session_ttl_seconds', extract(epoch from l.max_session_ttl))
                 from memchat.limits l));
end
$$;

-- record_turn, as before, on the caller's own session of that id.
create or replace function memchat.record_turn(
  p_session_id uuid,
  p_agent_name text,
  p_title text,
  p_messages jsonb,
  p_ttl interval,
  p_client_message_id text,
  p_notes text,
  p_notes_version integer,
  p_new_session boolean,
  p_embedding extensions.vector,
  p_due_after integer
) returns jsonb
language plpgsql
set search_path = ''
as $$
declare
  v_uid uuid := auth.uid();
  v_count integer := jsonb_array_length(p_messages);
  v_session public.chat_sessions;
  v_expired boolean;
  v_active uuid;
  v_ids bigint[];
  v_prompt bigint;
  v_completion bigint;
begin
  -- The turn's token usage: what its assistant messages carry (LangChain's
  -- usage_metadata; the final answer holds the whole turn's).
  select coalesce(sum((m->'data'->'usage_metadata'->>'input_tokens')::bigint), 0),
         coalesce(sum((m->'data'->'usage_metadata'->>'output_tokens')::bigint), 0)
    into v_prompt, v_completion
    from jsonb_array_elements(p_messages) m
   where m->>'type' = 'ai' and jsonb_typeof(m->'data'->'usage_metadata') = 'object';

  if p_new_session then
    -- Serialises the first turns of one (user, agent); the lock ends with
    -- the transaction, so it is safe behind a transaction-mode pooler.
    perform pg_advisory_xact_lock(
      hashtextextended('memchat.new_session/' || v_uid::text || '/' || p_agent_name, 0));
    select s.id into v_active
      from public.user_agent_active_sessions a
      join public.chat_sessions s on s.id = a.active_session_id and s.user_id = a.user_id
     where a.user_id = v_uid and a.agent_name = p_agent_name
       and s.status = 'active' and s.expires_at > now();
    p_session_id := coalesce(v_active, p_session_id);
  end if;

  select s.expires_at <= now() into v_expired
    from public.chat_sessions s where s.id = p_session_id and s.user_id = v_uid for update;
  if v_expired then
    delete from public.chat_message_history h
     where h.user_id = v_uid and h.session_id = p_session_id;
  end if;

  insert into public.chat_sessions as s
      (id, user_id, agent_name, title, message_count, last_active_at, expires_at,
       turn_count, prompt_tokens, completion_tokens)
  values (p_session_id, v_uid, p_agent_name, p_title, v_count, now(),
          memchat.session_expiry(p_ttl), 1, v_prompt, v_completion)
  on conflict (id, user_id) do update set
      message_count = case when s.expires_at <= now() then excluded.message_count
                           else s.message_count + excluded.message_count end,
      turn_count = case when s.expires_at <= now() then 1 else s.turn_count + 1 end,
      prompt_tokens = case when s.expires_at <= now() then excluded.prompt_tokens
                           else s.prompt_tokens + excluded.prompt_tokens end,
      completion_tokens = case when s.expires_at <= now() then excluded.completion_tokens
                               else s.completion_tokens + excluded.completion_tokens end,
      summary = case when s.expires_at <= now() then null else s.summary end,
      summary_covers_until =
        case when s.expires_at <= now() then null else s.summary_covers_until end,
      summary_covers_count =
        case when s.expires_at <= now() then 0 else s.summary_covers_count end,
      summary_updated_at =
        case when s.expires_at <= now() then null else s.summary_updated_at end,
      title = coalesce(s.title, excluded.title),
      status = 'active',
      last_active_at = excluded.last_active_at,
      expires_at = excluded.expires_at
  returning s.* into v_session;

  with inserted as (
    insert into public.chat_message_history (session_id, user_id, message, client_message_id)
    select p_session_id, v_uid, m.message, case when m.ord = 1 then p_client_message_id end
      from jsonb_array_elements(p_messages) with ordinality as m(message, ord)
     order by m.ord
    returning id)
  select array_agg(i.id order by i.id) into v_ids from inserted i;

  -- The first message of a turn is the user's.
  if p_embedding is not null then
    insert into memchat.message_embeddings
        (message_id, user_id, session_id, agent_name, created_at, embedding)
    values (v_ids[1], v_uid, p_session_id, v_session.agent_name, now(), p_embedding);
  end if;

  insert into public.user_agent_active_sessions as a
      (user_id, agent_name, active_session_id, last_active_at)
  values (v_uid, v_session.agent_name, p_session_id, now())
  on conflict (user_id, agent_name) do update set
      active_session_id = excluded.active_session_id,
      last_active_at = excluded.last_active_at;

  if p_notes is not null then
    perform memchat.save_notes(v_session.agent_name, p_notes, p_notes_version);
  end if;

  if p_client_message_id is not null then
    delete from memchat.turn_claims c
     where c.user_id = v_uid and c.client_message_id = p_client_message_id;
  end if;

  if p_due_after is not null
     and v_session.message_count - v_session.summary_covers_count >= p_due_after then
    insert into memchat.summary_queue as q (session_id, user_id)
    values (p_session_id, v_uid)
    on conflict (session_id, user_id) do update set attempts = 0, next_attempt_at = now()
     where q.next_attempt_at = 'infinity';
  end if;

  -- The ids of the turn's messages, in order: the user's first, the answer last.
  return to_jsonb(v_session) || jsonb_build_object('message_ids', to_jsonb(v_ids));
end
$$;

-- recall, as before, joining each embedding to its own user's session.
create or replace function memchat.recall(
  p_session_id uuid,
  p_agent_name text,
  p_window integer,
  p_query extensions.vector,
  p_k integer,
  p_min_score double precision,
  p_collapse double precision
) returns jsonb
language plpgsql stable
set search_path = ''
set enable_bitmapscan = off
as $$
declare
  v_uid uuid := auth.uid();
  v_floor bigint;
  v_kept extensions.vector[] := '{}';
  v_ids bigint[] := '{}';
  v_scores double precision[] := '{}';
  v_candidate record;
begin
  if p_k <= 0 then
    return '[]'::jsonb;
  end if;
  if p_session_id is null then
    -- The turn's session, resolved as load_context resolves it.
    select s.id into p_session_id
      from public.user_agent_active_sessions a
      join public.chat_sessions s on s.id = a.active_session_id and s.user_id = a.user_id
     where a.user_id = v_uid and a.agent_name = p_agent_name
       and s.status = 'active' and s.expires_at > now();
  end if;
  if p_session_id is not null and p_window > 0 then
    select min(w.id) into v_floor
      from (select h.id from public.chat_message_history h
             where h.user_id = v_uid and h.session_id = p_session_id
               and h.message->>'type' <> 'tool'
               and coalesce(jsonb_array_length(h.message->'data'->'tool_calls'), 0) = 0
             order by h.id desc
             limit p_window) w;
  end if;

  -- A few times k candidates, so that collapsing still leaves k.
  for v_candidate in
    select e.message_id, e.embedding,
           1 - (e.embedding operator(extensions.<=>) p_query) as score
      from memchat.message_embeddings e
      join public.chat_sessions s on s.id = e.session_id and s.user_id = e.user_id
     where e.user_id = v_uid and e.agent_name = p_agent_name
       and s.status = 'active' and s.expires_at > now()
       and (p_session_id is null or e.session_id <> p_session_id
            or e.message_id < coalesce(v_floor, 9223372036854775807))
     order by e.embedding operator(extensions.<=>) p_query
     limit p_k * 4
  loop
    exit when v_candidate.score < p_min_score or cardinality(v_ids) >= p_k;
    continue when exists (
      select 1 from unnest(v_kept) k(v)
       where 1 - (k.v operator(extensions.<=>) v_candidate.embedding) >= p_collapse);
    v_kept := v_kept || v_candidate.embedding;
    v_ids := v_ids || v_candidate.message_id;
    v_scores := v_scores || v_candidate.score;
  end loop;

  return coalesce((
    select jsonb_agg(jsonb_build_object(
             'message_id', h.id,
             'session_id', h.session_id,
             'created_at', h.created_at,
             'score', hit.score,
             'title', s.title,
             'question', left(h.message->'data'->>'content', 2000),
             'answer', left(a.message->'data'->>'content', 2000))
           order by hit.ord)
      from unnest(v_ids, v_scores) with ordinality as hit(id, score, ord)
      join public.chat_message_history h on h.id = hit.id
      join public.chat_sessions s on s.id = h.session_id and s.user_id = h.user_id
      left join lateral (
           select x.message from public.chat_message_history x
            where x.user_id = h.user_id and x.session_id = h.session_id and x.id > h.id
              and x.message->>'type' = 'ai'
              and coalesce(jsonb_array_length(x.message->'data'->'tool_calls'), 0) = 0
            order by x.id limit 1) a on true), '[]'::jsonb);
end
$$;

revoke all on function
  memchat.load_context(uuid, text, integer, boolean, text, text, double precision, integer,
                       double precision, integer)
  from public;
grant execute on function
  memchat.load_context(uuid, text, integer, boolean, text, text, double precision, integer,
                       double precision, integer)
  to memchat_user;
