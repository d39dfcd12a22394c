-- What one user may store: a quota on their messages, the longer messages an
-- import may hold, and the id of an expired session imported anew.
--
-- * memchat.limits.max_stored_messages (USER_MAX_STORED_MESSAGES): the most
--   messages a user's live sessions may hold. An expired session holds none
--   (it is gone for every purpose, whether or not the cleanup has deleted
--   it yet). Every write of messages (a chat turn, an import) is refused
--   whole past it (SQLSTATE MCQTA, its DETAIL the limit), under a lock per
--   user, so two writes at once cannot both pass it. The API's own setting
--   may be lower: it is set in each request's transaction as
--   memchat.max_stored_messages (store/db.py's SET_CLAIMS), and the lower of
--   the two holds.
-- * memchat.limits.max_import_message_chars (IMPORT_MAX_MESSAGE_CHARS): an
--   imported message is only stored, never sent to the model as a new turn
--   is, so the messages' trigger holds a user message to the larger of the
--   two bounds, and record_turn holds a new turn's to max_message_chars.
-- * memchat.import_sessions deletes the caller's expired sessions whose ids
--   it imports before it stores anything (they import, not "skip"), and
--   with p_request (a request's first transaction) checks the quota for the
--   whole request: its sessions the caller has live are not counted.

alter table memchat.limits
  add column max_stored_messages bigint not null default 100000
    check (max_stored_messages >= 1),
  add column max_import_message_chars integer not null default 200000
    check (max_import_message_chars >= 1);

-- ------------------------------------------------------------ the quota

-- The caller's messages: those of their live sessions (each session keeps
-- its count; a cleared one counts 0).
create function memchat.stored_messages() returns bigint
language plpgsql stable
set search_path = ''
as $$
begin
  return (select coalesce(sum(s.message_count), 0)::bigint from public.chat_sessions s
           where s.user_id = (select auth.uid()) and s.expires_at > now());
end
$$;

create function memchat.max_stored_messages() returns bigint
language plpgsql stable
set search_path = ''
as $$
declare
  v_api text := pg_catalog.current_setting('memchat.max_stored_messages', true);
begin
  return least((select l.max_stored_messages from memchat.limits l),
               case when v_api ~ '^[0-9]{1,18}$' then v_api::bigint end);
end
$$;

-- Raises MCQTA (DETAIL: the limit) when storing p_adding more messages
-- would take the caller past max_stored_messages. The lock (per user, to
-- the transaction's end: safe behind a transaction-mode pooler) makes a
-- concurrent write wait until this one has committed and counts it.
create function memchat.hold_stored_messages(p_adding bigint) returns void
language plpgsql
set search_path = ''
as $$
declare
  v_max bigint := memchat.max_stored_messages();
  v_stored bigint;
begin
  perform pg_catalog.pg_advisory_xact_lock(
    pg_catalog.hashtextextended('memchat.stored_messages/' || auth.uid()::text, 0));
  v_stored := memchat.stored_messages();
  if v_stored + p_adding > v_max then
    raise exception 'storing % more messages would pass the limit of % (% stored)',
      p_adding, v_max, v_stored
      using errcode = 'MCQTA', detail = v_max::text;
  end if;
end
$$;

revoke all on function memchat.stored_messages(), memchat.max_stored_messages(),
  memchat.hold_stored_messages(bigint) from public;
grant execute on function memchat.stored_messages(), memchat.max_stored_messages(),
  memchat.hold_stored_messages(bigint) to memchat_user;

-- ------------------------------------------------------------ messages

create or replace function memchat.check_message() returns trigger
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
     and char_length(new.message->'data'->>'content')
         > greatest(v_limits.max_message_chars, v_limits.max_import_message_chars) then
    raise exception 'message is over % characters',
      greatest(v_limits.max_message_chars, v_limits.max_import_message_chars)
      using errcode = 'MC413';
  end if;
  return new;
end
$$;

-- ------------------------------------------------------------ a turn

create or replace function memchat.record_turn(
  p_session_id uuid, p_agent_name text, p_title text, p_messages jsonb, p_ttl interval,
  p_client_message_id text, p_notes text, p_notes_version integer, p_new_session boolean,
  p_embedding extensions.vector, p_embedding_model text, p_due_after integer
)
returns jsonb
language plpgsql
set search_path = ''
set plan_cache_mode = force_generic_plan
as $function$
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
  -- A new turn's user message is held to max_message_chars (what may be
  -- sent to the model); the messages' trigger holds every stored one only to
  -- the larger bound an imported message has.
  if exists (select 1 from jsonb_array_elements(p_messages) m
              where m->>'type' = 'human'
                and char_length(m->'data'->>'content')
                    > (select l.max_message_chars from memchat.limits l)) then
    raise exception 'message is over % characters',
      (select l.max_message_chars from memchat.limits l) using errcode = 'MC413';
  end if;
  perform memchat.hold_stored_messages(v_count);

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
        (message_id, user_id, session_id, agent_name, created_at, model, embedding)
    values (v_ids[1], v_uid, p_session_id, v_session.agent_name, now(), p_embedding_model,
            p_embedding);
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
$function$

;

-- Also returns the caller's stored messages and the quota, so a turn past
-- it is refused before the model is called.
create or replace function memchat.load_context(
  p_session_id uuid, p_agent_name text, p_window integer, p_read_notes boolean,
  p_client_message_id text, p_message text, p_rate_per_minute double precision,
  p_rate_burst integer, p_claim_seconds double precision, p_read_max integer
)
returns jsonb
language plpgsql
set search_path = ''
set enable_bitmapscan = off
set plan_cache_mode = force_generic_plan
as $function$
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
    'stored_messages', memchat.stored_messages(),
    'limits', (select jsonb_build_object(
                 'max_stored_messages', memchat.max_stored_messages(),
                 'max_message_chars', l.max_message_chars,
                 'max_notes_chars', l.max_notes_chars,
                 'max_session_ttl_seconds', extract(epoch from l.max_session_ttl))
                 from memchat.limits l));
end
$function$

;

-- ------------------------------------------------------------ stats

-- With the caller's stored messages and their quota (per user, whatever
-- agent the stats are of).
create or replace function memchat.chat_stats(p_agent_name text) returns jsonb
language plpgsql stable
set search_path = ''
as $$
begin
  return (
    with s as (
      select s.* from public.chat_sessions s
       where s.user_id = (select auth.uid())
         and (p_agent_name is null or s.agent_name = p_agent_name)),
    f as (
      select f.rating, f.comment from memchat.message_feedback f
       where f.user_id = (select auth.uid())
         and (p_agent_name is null or f.agent_name = p_agent_name))
    select jsonb_build_object(
      'agent_name', p_agent_name,
      'sessions', jsonb_build_object(
          'total', count(*),
          'active', count(*) filter (where s.status = 'active' and s.expires_at > now()),
          'cleared', count(*) filter (where s.status = 'cleared')),
      'messages', coalesce(sum(s.message_count), 0),
      'turns', coalesce(sum(s.turn_count), 0),
      'tokens', jsonb_build_object(
          'prompt', coalesce(sum(s.prompt_tokens), 0),
          'completion', coalesce(sum(s.completion_tokens), 0)),
      'feedback', (select jsonb_build_object(
          'positive', count(*) filter (where f.rating = 1),
          'negative', count(*) filter (where f.rating = -1),
          'neutral', count(*) filter (where f.rating = 0),
          'with_comment', count(*) filter (where f.comment is not null)) from f),
      'first_activity_at', min(s.created_at),
      'last_activity_at', max(s.last_active_at),
      'avg_messages_per_session', coalesce(round(avg(s.message_count), 2), 0),
      'storage', jsonb_build_object(
          'stored_messages', memchat.stored_messages(),
          'max_stored_messages', memchat.max_stored_messages()))
    from s);
end
$$;

-- ------------------------------------------------------------ an import

drop function memchat.import_sessions(jsonb, jsonb, jsonb, interval);

-- As before (migration *_import.sql), and: the caller's expired sessions
-- with the ids given are deleted first (with their messages and what
-- depends on them), so they are imported, not skipped; with p_request
-- ([{"id", "messages"}]: every session of the whole request, the first
-- transaction's call) the quota is checked for the request's messages in
-- sessions the caller does not have live; and every call checks it for
-- what it stores itself.
create function memchat.import_sessions(
  p_sessions jsonb, p_feedback jsonb, p_notes jsonb, p_ttl interval, p_request jsonb
) returns jsonb
language plpgsql
set search_path = ''
as $$
declare
  v_uid uuid := auth.uid();
  v_stored uuid[];
  v_ids bigint[];
  v_owners uuid[];
  v_notes text[];
begin
  delete from public.chat_sessions s
   using jsonb_to_recordset(p_sessions) as g(id uuid)
   where s.id = g.id and s.user_id = v_uid and s.expires_at <= now();

  if p_request is not null then
    perform memchat.hold_stored_messages(
      (select coalesce(sum(r.messages), 0)::bigint
         from jsonb_to_recordset(p_request) as r(id uuid, messages bigint)
        where not exists (select 1 from public.chat_sessions s
                           where s.id = r.id and s.user_id = v_uid and s.expires_at > now())));
  else
    perform memchat.hold_stored_messages(
      (select coalesce(sum(jsonb_array_length(g.messages)), 0)::bigint
         from jsonb_to_recordset(p_sessions) as g(id uuid, messages jsonb)
        where not exists (select 1 from public.chat_sessions s
                           where s.id = g.id and s.user_id = v_uid)));
  end if;

  -- Counters as record_turn keeps them: a turn per user message, the tokens
  -- the answers' usage carries.
  with given as (
    select g.* from jsonb_to_recordset(p_sessions) as g(
      id uuid, agent_name text, title text, status text,
      created_at timestamptz, last_active_at timestamptz, messages jsonb)
  ), inserted as (
    insert into public.chat_sessions as s
        (id, user_id, agent_name, title, status, message_count, created_at, last_active_at,
         expires_at, turn_count, prompt_tokens, completion_tokens)
    select g.id, v_uid, g.agent_name, g.title, g.status, jsonb_array_length(g.messages),
           g.created_at, g.last_active_at, memchat.session_expiry(p_ttl),
           c.turns, c.prompt, c.completion
      from given g
      cross join lateral (
        select count(*) filter (where m.item->'message'->>'type' = 'human') as turns,
               coalesce(sum((m.item->'message'->'data'->'usage_metadata'->>'input_tokens')::bigint)
                          filter (where m.item->'message'->>'type' = 'ai'), 0) as prompt,
               coalesce(sum((m.item->'message'->'data'->'usage_metadata'->>'output_tokens')::bigint)
                          filter (where m.item->'message'->>'type' = 'ai'), 0) as completion
          from jsonb_array_elements(g.messages) as m(item)) c
    on conflict (id, user_id) do nothing
    returning s.id)
  select coalesce(array_agg(i.id), '{}') into v_stored from inserted i;

  -- One statement per batch, its rows in the file's order, so each session's
  -- messages get ascending ids in that order (as a turn's do).
  with inserted as (
    insert into public.chat_message_history
        (session_id, user_id, message, client_message_id, created_at)
    select g.id, v_uid, m.item->'message', m.item->>'client_message_id',
           (m.item->>'created_at')::timestamptz
      from jsonb_to_recordset(p_sessions) as g(id uuid, messages jsonb)
      cross join lateral jsonb_array_elements(g.messages) with ordinality as m(item, ord)
     where g.id = any(v_stored)
     order by g.id, m.ord
    returning id, session_id)
  select coalesce(array_agg(i.id order by i.id), '{}'), coalesce(array_agg(i.session_id order by i.id), '{}')
    into v_ids, v_owners
    from inserted i;

  -- What refers to a message by its place in its session: feedback on an
  -- answer, the last message a summary covers. A statement of its own, after
  -- the messages, as the feedback's row-level security checks its message.
  with numbered as (
    select n.id, n.session_id,
           row_number() over (partition by n.session_id order by n.id) as ordinal
      from unnest(v_ids, v_owners) as n(id, session_id)
  )
  insert into memchat.message_feedback
      (message_id, user_id, session_id, agent_name, rating, comment, created_at, updated_at)
  select n.id, v_uid, n.session_id, s.agent_name, f.rating, f.comment,
         coalesce(f.created_at, now()), coalesce(f.updated_at, f.created_at, now())
    from jsonb_to_recordset(p_feedback) as f(
           session_id uuid, ordinal bigint, rating smallint, comment text,
           created_at timestamptz, updated_at timestamptz)
    join numbered n on n.session_id = f.session_id and n.ordinal = f.ordinal
    join public.chat_sessions s on s.id = n.session_id and s.user_id = v_uid;

  with numbered as (
    select n.id, n.session_id,
           row_number() over (partition by n.session_id order by n.id) as ordinal
      from unnest(v_ids, v_owners) as n(id, session_id)
  )
  update public.chat_sessions s
     set summary = g.summary, summary_covers_until = n.id,
         summary_covers_count = g.summary_covers, summary_updated_at = g.summary_updated_at
    from jsonb_to_recordset(p_sessions) as g(
           id uuid, summary text, summary_covers integer, summary_updated_at timestamptz)
    join numbered n on n.session_id = g.id and n.ordinal = g.summary_covers
   where s.id = g.id and s.user_id = v_uid and g.summary is not null;

  with inserted as (
    insert into public.agent_long_term_memory as m
        (user_id, agent_name, notes, created_at, updated_at)
    select v_uid, n.agent_name, n.notes, coalesce(n.created_at, now()),
           coalesce(n.updated_at, n.created_at, now())
      from jsonb_to_recordset(p_notes) as n(
             agent_name text, notes text, created_at timestamptz, updated_at timestamptz)
    on conflict (user_id, agent_name) do nothing
    returning m.agent_name)
  select coalesce(array_agg(i.agent_name), '{}') into v_notes from inserted i;

  return jsonb_build_object('sessions', to_jsonb(v_stored), 'notes', to_jsonb(v_notes));
end
$$;

revoke all on function memchat.import_sessions(jsonb, jsonb, jsonb, interval, jsonb) from public;
grant execute on function memchat.import_sessions(jsonb, jsonb, jsonb, interval, jsonb)
  to memchat_user;
