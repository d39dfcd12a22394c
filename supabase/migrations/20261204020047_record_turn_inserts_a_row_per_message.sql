-- Written by `memchat db diff`: what supabase/schemas has that the
-- migrations before this one did not make:
--   function memchat.record_turn(uuid,uuid,text,text,jsonb,interval,text,text,integer,boolean,extensions.vector,text,integer)

set local check_function_bodies = off;

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
