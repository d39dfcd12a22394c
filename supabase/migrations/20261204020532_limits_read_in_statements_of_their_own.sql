-- Written by `memchat db diff`: what supabase/schemas has that the
-- migrations before this one did not make:
--   function memchat.check_notes()
--   function memchat.check_session()
--   function memchat.keep_notes_version()
--   function memchat.load_context(uuid,uuid,text,integer,boolean,text,text,double precision,integer,double precision,integer)
--   function memchat.max_stored_messages()
--   function memchat.record_turn(uuid,uuid,text,text,jsonb,interval,text,text,integer,boolean,extensions.vector,text,integer)
--   function memchat.session_expiry(interval)
--   function memchat.stored_messages()

set local check_function_bodies = off;

CREATE OR REPLACE FUNCTION memchat.check_notes()
 RETURNS trigger
 LANGUAGE plpgsql
 SET search_path TO ''
AS $function$
declare
  v_max integer;
begin
  select l.max_notes_chars into v_max from memchat.limits l;
  if char_length(new.notes) > v_max then
    raise exception 'notes are over % characters', v_max using errcode = 'MC413';
  end if;
  return new;
end
$function$;

CREATE OR REPLACE FUNCTION memchat.check_session()
 RETURNS trigger
 LANGUAGE plpgsql
 SET search_path TO ''
AS $function$
declare
  v_max interval;
begin
  if tg_op = 'INSERT' or new.expires_at is distinct from old.expires_at then
    select l.max_session_ttl into v_max from memchat.limits l;
    if new.expires_at > now() + v_max then
      raise exception 'expires_at is beyond the maximum session TTL' using errcode = 'MC422';
    end if;
  end if;
  return new;
end
$function$;

CREATE OR REPLACE FUNCTION memchat.keep_notes_version()
 RETURNS trigger
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO ''
AS $function$
declare
  v_kept integer;
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
  -- The limit read on its own: on Citus, where record_turn runs delegated
  -- to the user's worker, a statement there may read only that user's
  -- rows, which a subquery of another table is not.
  select l.notes_versions_kept into v_kept from memchat.limits l;
  delete from memchat.notes_versions v
   where v.user_id = new.user_id and v.agent_name = new.agent_name
     and v.version <= new.version - v_kept;
  return null;
end
$function$;

CREATE OR REPLACE FUNCTION memchat.load_context(p_user_id uuid, p_session_id uuid, p_agent_name text, p_window integer, p_read_notes boolean, p_client_message_id text, p_message text, p_rate_per_minute double precision, p_rate_burst integer, p_claim_seconds double precision, p_read_max integer)
 RETURNS jsonb
 LANGUAGE plpgsql
 SET search_path TO ''
 SET enable_bitmapscan TO 'off'
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
declare
  -- now() itself in ON CONFLICT DO UPDATE: refused by Citus (docs/deploy.md).
  v_now timestamptz := now();
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
  v_limits jsonb;
begin
  -- The caller as the API names it: on Citus the call is delegated by it
  -- to the worker holding that user's shards (`memchat db distribute`).
  if p_user_id is distinct from v_uid then
    raise exception 'the caller is not user %', p_user_id using errcode = '42501';
  end if;
  if p_session_id is not null then
    select s.* into v_session from public.chat_sessions s
     where s.id = p_session_id and s.user_id = v_uid;
  else
    select s.* into v_session
      from public.user_agent_active_sessions a
      join public.chat_sessions s on s.id = a.active_session_id and s.user_id = a.user_id
     where a.user_id = v_uid and a.agent_name = p_agent_name
       and s.status = 'active' and s.expires_at > v_now;
  end if;
  if v_session.id is not null then
    v_session_json := to_jsonb(v_session)
      || jsonb_build_object('expired', v_session.expires_at <= v_now);
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
       and c.expires_at > v_now;
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
            v_now + make_interval(secs => p_claim_seconds))
    on conflict (user_id, client_message_id) do update
       set message_digest = excluded.message_digest, expires_at = excluded.expires_at
     where c.expires_at <= v_now
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

  if v_session.id is not null and v_session.expires_at > v_now then
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

  select jsonb_build_object(
           'max_message_chars', l.max_message_chars,
           'max_notes_chars', l.max_notes_chars,
           'max_session_ttl_seconds', extract(epoch from l.max_session_ttl))
    into v_limits
    from memchat.limits l;
  return jsonb_build_object(
    'taken', false,
    'session', v_session_json,
    'notes', v_notes,
    'messages', v_messages,
    'summary', v_summary,
    'replay', null,
    'claimed', p_client_message_id is not null,
    'stored_messages', memchat.stored_messages(),
    'limits', v_limits || jsonb_build_object('max_stored_messages',
                                             memchat.max_stored_messages()));
end
$function$;

CREATE OR REPLACE FUNCTION memchat.max_stored_messages()
 RETURNS bigint
 LANGUAGE plpgsql
 STABLE
 SET search_path TO ''
AS $function$
declare
  v_api text := pg_catalog.current_setting('memchat.max_stored_messages', true);
  v_max bigint;
begin
  select l.max_stored_messages into v_max from memchat.limits l;
  return least(v_max, case when v_api ~ '^[0-9]{1,18}$' then v_api::bigint end);
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
  v_message jsonb;
  v_ord bigint;
  v_id bigint;
  v_max_chars integer;
begin
  -- The caller as the API names it: on Citus the call is delegated by it
  -- to the worker holding that user's shards (`memchat db distribute`).
  if p_user_id is distinct from v_uid then
    raise exception 'the caller is not user %', p_user_id using errcode = '42501';
  end if;
  -- A new turn's user message is held to max_message_chars (what may be
  -- sent to the model); the messages' trigger holds every stored one only to
  -- the larger bound an imported message has.
  select l.max_message_chars into v_max_chars from memchat.limits l;
  if exists (select 1 from jsonb_array_elements(p_messages) m
              where m->>'type' = 'human' and char_length(m->'data'->>'content') > v_max_chars) then
    raise exception 'message is over % characters', v_max_chars using errcode = 'MC413';
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

  -- A row per statement: a turn's few messages, each an insert Citus routes
  -- to the shard by its values alone (an INSERT ... SELECT would be
  -- planned as one across shards, its rows passed through a file).
  for v_message, v_ord in
    select m.message, m.ord
      from jsonb_array_elements(p_messages) with ordinality as m(message, ord)
     order by m.ord
  loop
    insert into public.chat_message_history (session_id, user_id, message, client_message_id)
    values (p_session_id, v_uid, v_message, case when v_ord = 1 then p_client_message_id end)
    returning id into v_id;
    v_ids := v_ids || v_id;
  end loop;

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

CREATE OR REPLACE FUNCTION memchat.session_expiry(p_ttl interval)
 RETURNS timestamp with time zone
 LANGUAGE plpgsql
 STABLE
 SET search_path TO ''
AS $function$
declare
  v_max interval;
begin
  select l.max_session_ttl into v_max from memchat.limits l;
  return now() + least(p_ttl, v_max);
end
$function$;

CREATE OR REPLACE FUNCTION memchat.stored_messages()
 RETURNS bigint
 LANGUAGE plpgsql
 STABLE
 SET search_path TO ''
 SET enable_seqscan TO 'off'
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
declare
  -- The caller, a parameter of each statement: on Citus, its shard.
  v_uid uuid := auth.uid();
  v_stored bigint;
begin
  select coalesce(sum(s.message_count), 0)::bigint into v_stored from public.chat_sessions s
   where s.user_id = v_uid and s.expires_at > now();
  return v_stored;
end
$function$;
