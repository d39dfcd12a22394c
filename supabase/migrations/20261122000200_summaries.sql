-- Rolling summaries (issue 11): each long session keeps a summary of the
-- messages that left its window, refreshed by a worker, never in a turn.
--
-- * A turn queues its session (memchat.summary_queue) once enough messages
--   beyond the window are outside the summary; same transaction as the turn.
-- * The worker logs in as `memchat_worker`: it may claim queue rows (ids
--   only) and nothing else; every read and write of a session it does as the
--   session's owner (`memchat_user` with the owner's claims), under RLS.

-- ------------------------------------------------------------------ role
do $$
begin
  if not exists (select 1 from pg_roles where rolname = 'memchat_worker') then
    create role memchat_worker login noinherit;
  end if;
end
$$;
grant memchat_user to memchat_worker;
grant usage on schema memchat to memchat_worker;

-- ------------------------------------------------------- the summary
alter table public.chat_sessions
  add column summary_covers_until bigint,
  add column summary_covers_count integer not null default 0
    check (summary_covers_count >= 0),
  add column summary_updated_at timestamptz;
comment on column public.chat_sessions.summary is
  'Model-written summary of the messages up to summary_covers_until (background, not instructions).';
comment on column public.chat_sessions.summary_covers_count is
  'How many of the session''s messages (all types) the summary covers.';

-- --------------------------------------------------------------- queue
create table memchat.summary_queue (
  session_id uuid primary key references public.chat_sessions (id) on delete cascade,
  user_id uuid not null,
  due_since timestamptz not null default now(),
  attempts integer not null default 0 check (attempts >= 0),
  -- A claim leases the row until then; a failure backs off until then;
  -- 'infinity': given up until the session's next turn.
  next_attempt_at timestamptz not null default now()
);
create index summary_queue_next_idx on memchat.summary_queue (next_attempt_at);
alter table memchat.summary_queue enable row level security;
revoke all on memchat.summary_queue from public;
grant select, insert, update, delete on memchat.summary_queue to memchat_user;
create policy summary_queue_own on memchat.summary_queue for all to memchat_user
  using (user_id = (select auth.uid())) with check (user_id = (select auth.uid()));
-- The worker's own view: which sessions are due and whose, never any content.
grant select (session_id, user_id, due_since, attempts, next_attempt_at),
  update (attempts, next_attempt_at) on memchat.summary_queue to memchat_worker;
create policy summary_queue_worker_select on memchat.summary_queue
  for select to memchat_worker using (true);
create policy summary_queue_worker_update on memchat.summary_queue
  for update to memchat_worker using (true) with check (true);

-- --------------------------------------------- what a refresh summarizes
-- As the owner: the session's summary so far and the conversational messages
-- after it that have left the window of p_window (at most p_chunk, oldest
-- first), as {"summary", "covers_until", "covers_count", "messages":
-- [{"id", "type", "content"}], "boundary"}; null when there is nothing to
-- summarize (cleared, deleted, expired, or caught up). `boundary` is the
-- last message id the refresh covers (tool rounds after the last
-- conversational message included).
create function memchat.summary_source(p_session_id uuid, p_window integer, p_chunk integer)
returns jsonb
language plpgsql stable
set search_path = ''
as $$
declare
  v_uid uuid := auth.uid();
  v_session public.chat_sessions;
  v_floor bigint;
  v_messages jsonb;
  v_last bigint;
begin
  select s.* into v_session from public.chat_sessions s
   where s.id = p_session_id and s.status = 'active' and s.expires_at > now();
  if v_session.id is null then
    return null;
  end if;
  -- The window's oldest message: only what is older has left the window.
  select min(w.id) into v_floor
    from (select h.id from public.chat_message_history h
           where h.user_id = v_uid and h.session_id = p_session_id
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
           where h.user_id = v_uid and h.session_id = p_session_id
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
    'covers_count', v_session.summary_covers_count,
    'messages', v_messages,
    'boundary', v_last);
end
$$;

-- As the owner: store a refreshed summary covering messages up to
-- p_covers_until, if the session still has the summary it was made from
-- (p_expected: its covers_until then) and still holds that message (a clear
-- in between deleted it). Then the session stays queued if it is still due
-- (a backlog, or new turns meanwhile), else leaves the queue. Returns
-- whether the summary was stored.
create function memchat.save_summary(
  p_session_id uuid,
  p_summary text,
  p_covers_until bigint,
  p_expected bigint,
  p_due_after integer
) returns boolean
language plpgsql
set search_path = ''
as $$
declare
  v_uid uuid := auth.uid();
  v_session public.chat_sessions;
  v_newly integer;
begin
  select count(*) into v_newly from public.chat_message_history h
   where h.user_id = v_uid and h.session_id = p_session_id
     and h.id > coalesce(p_expected, 0) and h.id <= p_covers_until;
  update public.chat_sessions s
     set summary = p_summary,
         summary_covers_until = p_covers_until,
         summary_covers_count = s.summary_covers_count + v_newly,
         summary_updated_at = now()
   where s.id = p_session_id and s.status = 'active'
     and s.summary_covers_until is not distinct from p_expected
     and exists (select 1 from public.chat_message_history h
                  where h.session_id = p_session_id and h.id = p_covers_until)
  returning s.* into v_session;
  perform memchat.settle_summary(p_session_id, p_due_after);
  return v_session.id is not null;
end
$$;

-- As the owner: keep the session queued (ready now, attempts reset) while
-- p_due_after or more of its messages are outside its summary, else take it
-- off the queue. p_due_after null: take it off.
create function memchat.settle_summary(p_session_id uuid, p_due_after integer)
returns void
language plpgsql
set search_path = ''
as $$
begin
  if p_due_after is not null and exists (
       select 1 from public.chat_sessions s
        where s.id = p_session_id and s.status = 'active'
          and s.message_count - s.summary_covers_count >= p_due_after) then
    update memchat.summary_queue q set attempts = 0, next_attempt_at = now()
     where q.session_id = p_session_id;
  else
    delete from memchat.summary_queue q where q.session_id = p_session_id;
  end if;
end
$$;

-- ------------------------------------------------------------ the turn
-- load_context, as before, and the summary when it is usable: only if it
-- leaves no hole before the window (the worker may be behind: the summary
-- and the window may overlap, but no message may fall between them).
create or replace function memchat.load_context(
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
set enable_bitmapscan = off
as $$
declare
  v_uid uuid := auth.uid();
  v_session public.chat_sessions;
  v_session_json jsonb;
  v_notes jsonb;
  v_messages jsonb := '[]'::jsonb;
  v_floor bigint;
  v_summary jsonb;
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
    select coalesce(jsonb_agg(w.message order by w.id), '[]'::jsonb), min(w.id)
      into v_messages, v_floor
      from (select h.id, h.message from public.chat_message_history h
             where h.user_id = v_uid and h.session_id = v_session.id
               and h.message->>'type' <> 'tool'
               and coalesce(jsonb_array_length(h.message->'data'->'tool_calls'), 0) = 0
             order by h.id desc
             limit p_window) w;
    -- The summary, unless a conversational message lies between it and the window.
    if v_session.summary is not null and p_read_notes and not exists (
         select 1 from public.chat_message_history h
          where h.user_id = v_uid and h.session_id = v_session.id
            and h.id > v_session.summary_covers_until and h.id < v_floor
            and h.message->>'type' <> 'tool'
            and coalesce(jsonb_array_length(h.message->'data'->'tool_calls'), 0) = 0) then
      v_summary := jsonb_build_object(
        'text', v_session.summary,
        'covers_until', v_session.summary_covers_until,
        'updated_at', v_session.summary_updated_at);
    end if;
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

-- record_turn, as before, and: a session restarted after expiring loses its
-- summary with its messages; a session with p_due_after or more messages
-- outside its summary is queued for the worker (a given-up one is retried).
drop function memchat.record_turn(uuid, text, text, jsonb, interval, text, text, integer, boolean,
                                  extensions.vector);

create function memchat.record_turn(
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
  v_first bigint;
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
  select min(i.id) into v_first from inserted i;

  -- The first message of a turn is the user's.
  if p_embedding is not null then
    insert into memchat.message_embeddings
        (message_id, user_id, session_id, agent_name, created_at, embedding)
    values (v_first, v_uid, p_session_id, v_session.agent_name, now(), p_embedding);
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
    on conflict (session_id) do update set attempts = 0, next_attempt_at = now()
     where q.next_attempt_at = 'infinity';
  end if;

  return to_jsonb(v_session);
end
$$;

revoke all on function
  memchat.summary_source(uuid, integer, integer),
  memchat.save_summary(uuid, text, bigint, bigint, integer),
  memchat.settle_summary(uuid, integer),
  memchat.record_turn(uuid, text, text, jsonb, interval, text, text, integer, boolean,
                      extensions.vector, integer)
  from public;
grant execute on function
  memchat.summary_source(uuid, integer, integer),
  memchat.save_summary(uuid, text, bigint, bigint, integer),
  memchat.settle_summary(uuid, integer),
  memchat.record_turn(uuid, text, text, jsonb, interval, text, text, integer, boolean,
                      extensions.vector, integer)
  to memchat_user;
