-- Least privilege (issue 9).
--
-- Who can do what:
-- * `authenticated` is the web app through Supabase's Data API (PostgREST):
--   it reads its own rows, deletes its own sessions and upserts its own
--   active-session pointer. Nothing else: no messages, no notes, no expiry.
-- * `memchat_api` is the API functions' login role. It holds no rights of its
--   own (NOINHERIT): every request switches, in its one transaction, to
--   `memchat_user`, so a code path that forgets the switch is refused.
-- * `memchat_user` carries the API's write grants and policies. It is a
--   member of `authenticated`, so it reads exactly as the Data API does and
--   `auth.uid()` works for it on Supabase too (custom roles cannot be given
--   the `auth` schema there; its members can).
-- * `memchat_cleanup` is the TTL cleanup's login role: it sees and deletes
--   expired sessions only, and reads no message content.
-- Roles are created without passwords; docs/deploy.md says how to set them.
-- Limits that matter are enforced here too (memchat.limits), whoever writes.

-- ------------------------------------------------------------------ roles
do $$
begin
  if not exists (select 1 from pg_roles where rolname = 'memchat_user') then
    create role memchat_user nologin inherit;
  end if;
  if not exists (select 1 from pg_roles where rolname = 'memchat_api') then
    create role memchat_api login noinherit;
  end if;
  if not exists (select 1 from pg_roles where rolname = 'memchat_cleanup') then
    create role memchat_cleanup login noinherit;
  end if;
end
$$;

grant authenticated to memchat_user;
grant memchat_user to memchat_api;

revoke usage on schema memchat from authenticated;
grant usage on schema memchat to memchat_user, memchat_cleanup;

-- --------------------------------------------------------------- limits
-- One row. Raise a limit with `update memchat.limits set ...` (the API's own
-- settings must stay within these; see docs/deploy.md).
create table memchat.limits (
  singleton boolean primary key default true check (singleton),
  -- A user message's text (the API's MAX_MESSAGE_CHARS).
  max_message_chars integer not null default 16000 check (max_message_chars > 0),
  -- Any stored message as JSON: answers, tool calls and results included.
  max_message_bytes integer not null default 262144 check (max_message_bytes >= 1024),
  -- The long-term notes of one (user, agent) (the API's LTM_MAX_CHARS).
  max_notes_chars integer not null default 8000 check (max_notes_chars > 0),
  -- How far ahead a session's expires_at may be set (SESSION_TTL_HOURS).
  max_session_ttl interval not null default interval '168 hours'
    check (max_session_ttl > interval '0')
);
insert into memchat.limits default values;
comment on table memchat.limits is
  'Limits every writer is held to (triggers on the user tables). One row.';

revoke all on memchat.limits from public;
grant select on memchat.limits to memchat_user, service_role;

-- now() + ttl, never beyond the maximum TTL.
create function memchat.session_expiry(p_ttl interval) returns timestamptz
language sql stable
set search_path = ''
as $$
  select now() + least(p_ttl, (select l.max_session_ttl from memchat.limits l))
$$;

-- SQLSTATE MC413: too large; MC422: not an allowed value.
create function memchat.check_message() returns trigger
language plpgsql
set search_path = ''
as $$
declare
  v_limits memchat.limits;
  v_type text := new.message->>'type';
begin
  select * into v_limits from memchat.limits;
  if jsonb_typeof(new.message) is distinct from 'object'
     or jsonb_typeof(new.message->'data') is distinct from 'object' then
    raise exception 'a message must be {"type": ..., "data": {...}}' using errcode = 'MC422';
  end if;
  if v_type is null or v_type not in ('human', 'ai', 'tool') then
    raise exception 'message type % is not allowed', coalesce(v_type, 'null')
      using errcode = 'MC422';
  end if;
  if octet_length(new.message::text) > v_limits.max_message_bytes then
    raise exception 'message is over % bytes', v_limits.max_message_bytes using errcode = 'MC413';
  end if;
  if v_type = 'human'
     and char_length(new.message->'data'->>'content') > v_limits.max_message_chars then
    raise exception 'message is over % characters', v_limits.max_message_chars
      using errcode = 'MC413';
  end if;
  return new;
end
$$;

create trigger chat_message_history_limits
  before insert or update on public.chat_message_history
  for each row execute function memchat.check_message();

create function memchat.check_notes() returns trigger
language plpgsql
set search_path = ''
as $$
begin
  if char_length(new.notes) > (select l.max_notes_chars from memchat.limits l) then
    raise exception 'notes are over % characters', (select l.max_notes_chars from memchat.limits l)
      using errcode = 'MC413';
  end if;
  return new;
end
$$;

create trigger agent_long_term_memory_limits
  before insert or update of notes on public.agent_long_term_memory
  for each row execute function memchat.check_notes();

-- Only a new or moved expiry is checked: lowering the maximum must not make
-- existing sessions impossible to update (clear, say).
create function memchat.check_session() returns trigger
language plpgsql
set search_path = ''
as $$
begin
  if (tg_op = 'INSERT' or new.expires_at is distinct from old.expires_at)
     and new.expires_at > now() + (select l.max_session_ttl from memchat.limits l) then
    raise exception 'expires_at is beyond the maximum session TTL' using errcode = 'MC422';
  end if;
  return new;
end
$$;

create trigger chat_sessions_limits
  before insert or update on public.chat_sessions
  for each row execute function memchat.check_session();

revoke all on function memchat.session_expiry(interval), memchat.check_message(),
  memchat.check_notes(), memchat.check_session() from public;
grant execute on function memchat.session_expiry(interval) to memchat_user;

-- ------------------------------------------- the Data API: read, not write
revoke all on public.chat_sessions, public.user_agent_active_sessions,
  public.chat_message_history, public.agent_long_term_memory from anon, authenticated, public;

grant select on public.chat_sessions, public.user_agent_active_sessions,
  public.chat_message_history, public.agent_long_term_memory to authenticated;
grant delete on public.chat_sessions to authenticated;
-- An upsert from supabase-js sets every column it sends: these three.
grant insert (user_id, agent_name, active_session_id),
  update (user_id, agent_name, active_session_id)
  on public.user_agent_active_sessions to authenticated;

-- ------------------------------------------------ the API: memchat_user
grant insert, update on public.chat_sessions to memchat_user;
grant insert, update, delete on public.user_agent_active_sessions to memchat_user;
grant insert, delete on public.chat_message_history to memchat_user;
grant insert, update, delete on public.agent_long_term_memory to memchat_user;

-- The select/delete policies for `authenticated` apply to its member
-- memchat_user too; the writes only the API may do are memchat_user's.
alter policy chat_sessions_insert on public.chat_sessions to memchat_user;
alter policy chat_sessions_update on public.chat_sessions to memchat_user;
alter policy active_sessions_delete on public.user_agent_active_sessions to memchat_user;
alter policy messages_insert on public.chat_message_history to memchat_user;
alter policy messages_delete on public.chat_message_history to memchat_user;
alter policy ltm_insert on public.agent_long_term_memory to memchat_user;
alter policy ltm_update on public.agent_long_term_memory to memchat_user;
alter policy ltm_delete on public.agent_long_term_memory to memchat_user;

revoke execute on function memchat.session_id_taken(uuid), memchat.current_user_exists(),
  memchat.save_notes(text, text, integer) from authenticated;
grant execute on function memchat.session_id_taken(uuid), memchat.current_user_exists(),
  memchat.save_notes(text, text, integer) to memchat_user;

-- ------------------------------------------------- the cleanup's view
-- Expired sessions only; of messages, their ids (to count them), no content.
grant select (id, expires_at), update (expires_at), delete
  on public.chat_sessions to memchat_cleanup;
grant select (id, session_id) on public.chat_message_history to memchat_cleanup;

create policy chat_sessions_cleanup_select on public.chat_sessions
  for select to memchat_cleanup using (expires_at <= now());
-- Lets the cleanup lock (FOR UPDATE SKIP LOCKED) what it is about to delete;
-- it can never change a row.
create policy chat_sessions_cleanup_lock on public.chat_sessions
  for update to memchat_cleanup using (expires_at <= now()) with check (false);
create policy chat_sessions_cleanup_delete on public.chat_sessions
  for delete to memchat_cleanup using (expires_at <= now());
create policy messages_cleanup_count on public.chat_message_history
  for select to memchat_cleanup using (true);

-- ------------------------------------------------------ chat throttle
-- A token bucket per user: refilled continuously at the configured rate,
-- capped at the burst; each chat turn takes one token.
create table memchat.chat_rate (
  user_id uuid primary key references auth.users (id) on delete cascade,
  tokens double precision not null,
  refilled_at timestamptz not null
);
alter table memchat.chat_rate enable row level security;
revoke all on memchat.chat_rate from public;
grant select, insert, update, delete on memchat.chat_rate to memchat_user;
create policy chat_rate_own on memchat.chat_rate for all to memchat_user
  using (user_id = (select auth.uid())) with check (user_id = (select auth.uid()));

-- Takes a token from the caller's bucket; returns 0 if it got one, else the
-- seconds until one is available (and takes nothing). Concurrent turns of
-- one user queue on the bucket's row for the length of this call's
-- transaction (one round trip).
create function memchat.take_chat_token(p_per_minute double precision, p_burst integer)
returns double precision
language plpgsql
set search_path = ''
as $$
declare
  v_uid uuid := auth.uid();
  v_level double precision;
begin
  insert into memchat.chat_rate (user_id, tokens, refilled_at)
  values (v_uid, p_burst, now())
  on conflict (user_id) do nothing;
  select least(p_burst::double precision,
               r.tokens + greatest(0, extract(epoch from now() - r.refilled_at))
                          * p_per_minute / 60)
    into v_level
    from memchat.chat_rate r where r.user_id = v_uid
     for update;
  if v_level < 1 then
    return (1 - v_level) * 60 / p_per_minute;
  end if;
  update memchat.chat_rate r
     set tokens = v_level - 1, refilled_at = greatest(r.refilled_at, now())
   where r.user_id = v_uid;
  return 0;
end
$$;

-- ------------------------------------------------------- turn claims
-- A chat turn with a client_message_id claims the key while the model
-- answers, so concurrent retries wait for the stored answer instead of
-- calling the model again. The turn's record deletes the claim; a failed
-- turn releases it; a crashed one expires.
create table memchat.turn_claims (
  user_id uuid not null references auth.users (id) on delete cascade,
  client_message_id text not null check (char_length(client_message_id) between 1 and 128),
  message_digest bytea not null,
  expires_at timestamptz not null,
  primary key (user_id, client_message_id)
);
alter table memchat.turn_claims enable row level security;
revoke all on memchat.turn_claims from public;
grant select, insert, update, delete on memchat.turn_claims to memchat_user;
create policy turn_claims_own on memchat.turn_claims for all to memchat_user
  using (user_id = (select auth.uid())) with check (user_id = (select auth.uid()));
grant select (expires_at), delete on memchat.turn_claims to memchat_cleanup;
create policy turn_claims_cleanup on memchat.turn_claims
  for select to memchat_cleanup using (expires_at <= now());
create policy turn_claims_cleanup_delete on memchat.turn_claims
  for delete to memchat_cleanup using (expires_at <= now());

-- ------------------------------------------------- the turn, version 2
drop function memchat.load_context(uuid, text, integer, boolean, text);
drop function memchat.record_turn(uuid, text, text, jsonb, interval, text, text, integer);

-- Resolve the session and read what a turn starts from, in one call:
-- {"taken": true}                       another user's session id
-- {"idempotency": "conflict"}           the key was used with another message
-- {"idempotency": "in_flight"}          the same turn is being answered now
-- {"throttled": seconds}                out of chat tokens: retry after
-- {"taken": false, "session", "replay"} the stored answer of this key
-- {"taken": false, "session", "notes", "messages", "claimed", "limits"}
-- With p_client_message_id, the key is claimed for p_claim_seconds.
create function memchat.load_context(
  p_session_id uuid,
  p_agent_name text,
  p_window integer,
  p_read_notes boolean,
  p_client_message_id text,
  p_message text,
  p_rate_per_minute double precision,
  p_rate_burst integer,
  p_claim_seconds double precision
) returns jsonb
language plpgsql
set search_path = ''
-- Every read here is a key lookup or the top N of one index range. When the
-- planner underestimates a session's size it may prefer a bitmap scan that
-- reads the whole session and sorts it; the ordered index scan is never worse.
set enable_bitmapscan = off
as $$
declare
  v_uid uuid := auth.uid();
  v_session public.chat_sessions;
  v_session_json jsonb;
  v_notes jsonb;
  v_messages jsonb := '[]'::jsonb;
  v_stored text;
  v_replay jsonb;
  v_same boolean;
  v_retry double precision;
  v_digest bytea;
begin
  if p_session_id is not null then
    select s.* into v_session from public.chat_sessions s where s.id = p_session_id;
    if v_session.id is null and memchat.session_id_taken(p_session_id) then
      return jsonb_build_object('taken', true);
    end if;
  else
    select s.* into v_session
      from public.user_agent_active_sessions a
      join public.chat_sessions s on s.id = a.active_session_id
     where a.user_id = v_uid and a.agent_name = p_agent_name
       and s.status = 'active' and s.expires_at > now();
  end if;
  if v_session.id is not null then
    v_session_json := to_jsonb(v_session)
      || jsonb_build_object('expired', v_session.expires_at <= now());
  end if;

  if p_client_message_id is not null then
    if v_session.id is not null then
      select u.message->'data'->>'content', a.message into v_stored, v_replay
        from public.chat_message_history u
        left join lateral (
             select x.message from public.chat_message_history x
              where x.session_id = u.session_id and x.id > u.id
                and x.message->>'type' = 'ai'
                and coalesce(jsonb_array_length(x.message->'data'->'tool_calls'), 0) = 0
              order by x.id limit 1) a on true
       where u.session_id = v_session.id and u.client_message_id = p_client_message_id;
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
    v_retry := memchat.take_chat_token(p_rate_per_minute, p_rate_burst);
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
    -- Walks chat_message_history_window_idx and stops after p_window entries.
    select coalesce(jsonb_agg(w.message order by w.id), '[]'::jsonb) into v_messages
      from (select h.id, h.message from public.chat_message_history h
             where h.user_id = v_uid and h.session_id = v_session.id
               and h.message->>'type' <> 'tool'
               and coalesce(jsonb_array_length(h.message->'data'->'tool_calls'), 0) = 0
             order by h.id desc
             limit p_window) w;
  end if;

  return jsonb_build_object(
    'taken', false,
    'session', v_session_json,
    'notes', v_notes,
    'messages', v_messages,
    'replay', null,
    'claimed', p_client_message_id is not null,
    'limits', (select jsonb_build_object(
                 'max_message_chars', l.max_message_chars,
                 'max_notes_chars', l.max_notes_chars,
                 'max_session_ttl_seconds', extract(epoch from l.max_session_ttl))
                 from memchat.limits l));
end
$$;

-- Store a whole turn atomically and return the session as JSON. The session
-- row is locked first, so concurrent turns on one session queue up and each
-- turn's messages get consecutive ids. A turn on an expired session that
-- cleanup has not reached yet starts the conversation over.
-- p_new_session: the caller had no session and none was active; if another
-- turn made one active meanwhile (two first messages at once), this turn
-- joins it instead of starting a second conversation.
-- p_notes null: the notes were not changed; else saved with the version check
-- of memchat.save_notes (SQLSTATE MC409 on a concurrent change).
create function memchat.record_turn(
  p_session_id uuid,
  p_agent_name text,
  p_title text,
  p_messages jsonb,
  p_ttl interval,
  p_client_message_id text,
  p_notes text,
  p_notes_version integer,
  p_new_session boolean
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
begin
  if p_new_session then
    -- Serialises the first turns of one (user, agent); the lock ends with
    -- the transaction, so it is safe behind a transaction-mode pooler.
    perform pg_advisory_xact_lock(
      hashtextextended('memchat.new_session/' || v_uid::text || '/' || p_agent_name, 0));
    select s.id into v_active
      from public.user_agent_active_sessions a
      join public.chat_sessions s on s.id = a.active_session_id
     where a.user_id = v_uid and a.agent_name = p_agent_name
       and s.status = 'active' and s.expires_at > now();
    p_session_id := coalesce(v_active, p_session_id);
  end if;

  select s.expires_at <= now() into v_expired
    from public.chat_sessions s where s.id = p_session_id for update;
  if v_expired then
    delete from public.chat_message_history h where h.session_id = p_session_id;
  end if;

  insert into public.chat_sessions as s
      (id, user_id, agent_name, title, message_count, last_active_at, expires_at)
  values (p_session_id, v_uid, p_agent_name, p_title, v_count, now(),
          memchat.session_expiry(p_ttl))
  on conflict (id) do update set
      message_count = case when s.expires_at <= now() then excluded.message_count
                           else s.message_count + excluded.message_count end,
      title = coalesce(s.title, excluded.title),
      status = 'active',
      last_active_at = excluded.last_active_at,
      expires_at = excluded.expires_at
  returning s.* into v_session;

  insert into public.chat_message_history (session_id, user_id, message, client_message_id)
  select p_session_id, v_uid, m.message, case when m.ord = 1 then p_client_message_id end
    from jsonb_array_elements(p_messages) with ordinality as m(message, ord)
   order by m.ord;

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

  return to_jsonb(v_session);
end
$$;

revoke all on function
  memchat.take_chat_token(double precision, integer),
  memchat.load_context(uuid, text, integer, boolean, text, text, double precision, integer,
                       double precision),
  memchat.record_turn(uuid, text, text, jsonb, interval, text, text, integer, boolean)
  from public;
grant execute on function
  memchat.take_chat_token(double precision, integer),
  memchat.load_context(uuid, text, integer, boolean, text, text, double precision, integer,
                       double precision),
  memchat.record_turn(uuid, text, text, jsonb, interval, text, text, integer, boolean)
  to memchat_user;
