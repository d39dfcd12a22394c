-- Written by `memchat db diff`: what supabase/schemas has that the
-- migrations before this one did not make:
--   function memchat.chat_stats(text) (dropped)
--   function memchat.chat_stats(uuid,text)
--   function memchat.import_sessions(jsonb,jsonb,jsonb,interval,jsonb) (dropped)
--   function memchat.import_sessions(uuid,jsonb,jsonb,jsonb,interval,jsonb)
--   function memchat.record_turn(uuid,uuid,text,text,jsonb,interval,text,text,integer,boolean,extensions.vector,text,integer)
--   function memchat.restore_notes(text,integer,integer) (dropped)
--   function memchat.restore_notes(uuid,text,integer,integer)
--   function memchat.save_notes(text,text,integer) (dropped)
--   function memchat.save_notes(uuid,text,text,integer)
--   function memchat.session_stats(uuid) (dropped)
--   function memchat.session_stats(uuid,uuid)
--   privileges on function memchat.chat_stats(uuid,text)
--   privileges on function memchat.import_sessions(uuid,jsonb,jsonb,jsonb,interval,jsonb)
--   privileges on function memchat.restore_notes(uuid,text,integer,integer)
--   privileges on function memchat.save_notes(uuid,text,text,integer)
--   privileges on function memchat.session_stats(uuid,uuid)

set local check_function_bodies = off;

drop function if exists memchat.chat_stats(text);

CREATE OR REPLACE FUNCTION memchat.chat_stats(p_user_id uuid, p_agent_name text)
 RETURNS jsonb
 LANGUAGE plpgsql
 STABLE
 SET search_path TO ''
AS $function$
declare
  -- The caller, a parameter of each statement: on Citus, its shard.
  v_uid uuid := auth.uid();
  -- Read first, each in a statement of its own (on Citus, a function
  -- reading a distributed table cannot run inside a statement that does).
  v_stored bigint := memchat.stored_messages();
  v_max bigint := memchat.max_stored_messages();
begin
  -- The caller as the API names it: on Citus the call is delegated by it
  -- to the worker holding that user's shards (`memchat db distribute`).
  if p_user_id is distinct from v_uid then
    raise exception 'the caller is not user %', p_user_id using errcode = '42501';
  end if;
  return (
    with s as (
      select s.* from public.chat_sessions s
       where s.user_id = v_uid
         and (p_agent_name is null or s.agent_name = p_agent_name)),
    f as (
      select f.rating, f.comment from memchat.message_feedback f
       where f.user_id = v_uid
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
          'stored_messages', v_stored,
          'max_stored_messages', v_max))
    from s);
end
$function$;

drop function if exists memchat.import_sessions(jsonb,jsonb,jsonb,interval,jsonb);

CREATE OR REPLACE FUNCTION memchat.import_sessions(p_user_id uuid, p_sessions jsonb, p_feedback jsonb, p_notes jsonb, p_ttl interval, p_request jsonb)
 RETURNS jsonb
 LANGUAGE plpgsql
 SET search_path TO ''
AS $function$
declare
  v_uid uuid := auth.uid();
  v_stored uuid[];
  v_ids bigint[];
  v_owners uuid[];
  v_notes text[];
begin
  -- The caller as the API names it: on Citus the call is delegated by it
  -- to the worker holding that user's shards (`memchat db distribute`).
  if p_user_id is distinct from v_uid then
    raise exception 'the caller is not user %', p_user_id using errcode = '42501';
  end if;
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
$function$;

CREATE OR REPLACE FUNCTION memchat.record_turn(p_user_id uuid, p_session_id uuid, p_agent_name text, p_title text, p_messages jsonb, p_ttl interval, p_client_message_id text, p_notes text, p_notes_version integer, p_new_session boolean, p_embedding extensions.vector, p_embedding_model text, p_due_after integer)
 RETURNS jsonb
 LANGUAGE plpgsql
 SET search_path TO ''
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
declare
  -- now() itself in ON CONFLICT DO UPDATE: refused by Citus (docs/deploy.md).
  v_now timestamptz := now();
  v_uid uuid := auth.uid();
  v_count integer := jsonb_array_length(p_messages);
  v_session public.chat_sessions;
  v_expired boolean;
  v_active uuid;
  v_ids bigint[];
  v_prompt bigint;
  v_completion bigint;
begin
  -- The caller as the API names it: on Citus the call is delegated by it
  -- to the worker holding that user's shards (`memchat db distribute`).
  if p_user_id is distinct from v_uid then
    raise exception 'the caller is not user %', p_user_id using errcode = '42501';
  end if;
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
       and s.status = 'active' and s.expires_at > v_now;
    p_session_id := coalesce(v_active, p_session_id);
  end if;

  select s.expires_at <= v_now into v_expired
    from public.chat_sessions s where s.id = p_session_id and s.user_id = v_uid for update;
  if v_expired then
    delete from public.chat_message_history h
     where h.user_id = v_uid and h.session_id = p_session_id;
  end if;

  insert into public.chat_sessions as s
      (id, user_id, agent_name, title, message_count, last_active_at, expires_at,
       turn_count, prompt_tokens, completion_tokens)
  values (p_session_id, v_uid, p_agent_name, p_title, v_count, v_now,
          memchat.session_expiry(p_ttl), 1, v_prompt, v_completion)
  on conflict (id, user_id) do update set
      message_count = case when s.expires_at <= v_now then excluded.message_count
                           else s.message_count + excluded.message_count end,
      turn_count = case when s.expires_at <= v_now then 1 else s.turn_count + 1 end,
      prompt_tokens = case when s.expires_at <= v_now then excluded.prompt_tokens
                           else s.prompt_tokens + excluded.prompt_tokens end,
      completion_tokens = case when s.expires_at <= v_now then excluded.completion_tokens
                               else s.completion_tokens + excluded.completion_tokens end,
      summary = case when s.expires_at <= v_now then null else s.summary end,
      summary_covers_until =
        case when s.expires_at <= v_now then null else s.summary_covers_until end,
      summary_covers_count =
        case when s.expires_at <= v_now then 0 else s.summary_covers_count end,
      summary_updated_at =
        case when s.expires_at <= v_now then null else s.summary_updated_at end,
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
    values (v_ids[1], v_uid, p_session_id, v_session.agent_name, v_now, p_embedding_model,
            p_embedding);
  end if;

  insert into public.user_agent_active_sessions as a
      (user_id, agent_name, active_session_id, last_active_at)
  values (v_uid, v_session.agent_name, p_session_id, v_now)
  on conflict (user_id, agent_name) do update set
      active_session_id = excluded.active_session_id,
      last_active_at = excluded.last_active_at;

  if p_notes is not null then
    perform memchat.save_notes(v_uid, v_session.agent_name, p_notes, p_notes_version);
  end if;

  if p_client_message_id is not null then
    delete from memchat.turn_claims c
     where c.user_id = v_uid and c.client_message_id = p_client_message_id;
  end if;

  if p_due_after is not null
     and v_session.message_count - v_session.summary_covers_count >= p_due_after then
    insert into memchat.summary_queue as q (session_id, user_id)
    values (p_session_id, v_uid)
    on conflict (session_id, user_id) do update set attempts = 0, next_attempt_at = v_now
     where q.next_attempt_at = 'infinity';
  end if;

  -- The ids of the turn's messages, in order: the user's first, the answer last.
  return to_jsonb(v_session) || jsonb_build_object('message_ids', to_jsonb(v_ids));
end
$function$;

drop function if exists memchat.restore_notes(text,integer,integer);

CREATE OR REPLACE FUNCTION memchat.restore_notes(p_user_id uuid, p_agent_name text, p_version integer, p_expected_version integer)
 RETURNS integer
 LANGUAGE plpgsql
 SET search_path TO ''
AS $function$
declare
  -- The caller, a parameter of each statement: on Citus, its shard.
  v_uid uuid := auth.uid();
  v_notes text;
begin
  -- The caller as the API names it: on Citus the call is delegated by it
  -- to the worker holding that user's shards (`memchat db distribute`).
  if p_user_id is distinct from v_uid then
    raise exception 'the caller is not user %', p_user_id using errcode = '42501';
  end if;
  select v.notes into v_notes from memchat.notes_versions v
   where v.user_id = v_uid and v.agent_name = p_agent_name
     and v.version = p_version;
  if not found then
    return null;
  end if;
  return memchat.save_notes(v_uid, p_agent_name, v_notes, p_expected_version);
end
$function$;

drop function if exists memchat.save_notes(text,text,integer);

CREATE OR REPLACE FUNCTION memchat.save_notes(p_user_id uuid, p_agent_name text, p_notes text, p_expected_version integer)
 RETURNS integer
 LANGUAGE plpgsql
 SET search_path TO ''
AS $function$
declare
  -- The caller, a parameter of each statement: on Citus, its shard.
  v_uid uuid := auth.uid();
  -- now() itself in ON CONFLICT DO UPDATE: refused by Citus (docs/deploy.md).
  v_now timestamptz := now();
  v_version integer;
begin
  -- The caller as the API names it: on Citus the call is delegated by it
  -- to the worker holding that user's shards (`memchat db distribute`).
  if p_user_id is distinct from v_uid then
    raise exception 'the caller is not user %', p_user_id using errcode = '42501';
  end if;
  if p_expected_version is null then
    insert into public.agent_long_term_memory as m (user_id, agent_name, notes)
    values (v_uid, p_agent_name, p_notes)
    on conflict (user_id, agent_name) do update
      set notes = excluded.notes, version = m.version + 1, updated_at = v_now
    returning m.version into v_version;
  elsif p_expected_version = 0 then
    insert into public.agent_long_term_memory as m (user_id, agent_name, notes)
    values (v_uid, p_agent_name, p_notes)
    on conflict (user_id, agent_name) do nothing
    returning m.version into v_version;
  else
    update public.agent_long_term_memory as m
       set notes = p_notes, version = m.version + 1, updated_at = v_now
     where m.user_id = v_uid and m.agent_name = p_agent_name
       and m.version = p_expected_version
    returning m.version into v_version;
  end if;
  if v_version is null then
    raise exception 'long-term notes of agent % changed concurrently', p_agent_name
      using errcode = 'MC409';
  end if;
  return v_version;
end
$function$;

drop function if exists memchat.session_stats(uuid);

CREATE OR REPLACE FUNCTION memchat.session_stats(p_user_id uuid, p_session_id uuid)
 RETURNS jsonb
 LANGUAGE plpgsql
 STABLE
 SET search_path TO ''
AS $function$
declare
  -- The caller, a parameter of each statement: on Citus, its shard.
  v_uid uuid := auth.uid();
begin
  -- The caller as the API names it: on Citus the call is delegated by it
  -- to the worker holding that user's shards (`memchat db distribute`).
  if p_user_id is distinct from v_uid then
    raise exception 'the caller is not user %', p_user_id using errcode = '42501';
  end if;
  return (
    select jsonb_build_object(
      'session_id', s.id,
      'agent_name', s.agent_name,
      'status', case when s.status = 'active' and s.expires_at <= now() then 'expired'
                     else s.status end,
      'messages', s.message_count,
      'turns', s.turn_count,
      'tokens', jsonb_build_object('prompt', s.prompt_tokens, 'completion', s.completion_tokens),
      'feedback', (select jsonb_build_object(
          'positive', count(*) filter (where f.rating = 1),
          'negative', count(*) filter (where f.rating = -1),
          'neutral', count(*) filter (where f.rating = 0),
          'with_comment', count(*) filter (where f.comment is not null))
          from memchat.message_feedback f where f.session_id = s.id and f.user_id = v_uid),
      'first_activity_at', s.created_at,
      'last_activity_at', s.last_active_at,
      'duration_seconds', round(extract(epoch from s.last_active_at - s.created_at)::numeric, 3))
    from public.chat_sessions s
    where s.id = p_session_id and s.user_id = v_uid);
end
$function$;

revoke all on function memchat.chat_stats(uuid,text) from public;

grant execute on function memchat.chat_stats(uuid,text) to memchat_user;

revoke all on function memchat.import_sessions(uuid,jsonb,jsonb,jsonb,interval,jsonb) from public;

grant execute on function memchat.import_sessions(uuid,jsonb,jsonb,jsonb,interval,jsonb) to memchat_user;

revoke all on function memchat.restore_notes(uuid,text,integer,integer) from public;

grant execute on function memchat.restore_notes(uuid,text,integer,integer) to memchat_user;

revoke all on function memchat.save_notes(uuid,text,text,integer) from public;

grant execute on function memchat.save_notes(uuid,text,text,integer) to memchat_user;

grant execute on function memchat.save_notes(uuid,text,text,integer) to service_role;

revoke all on function memchat.session_stats(uuid,uuid) from public;

grant execute on function memchat.session_stats(uuid,uuid) to memchat_user;
