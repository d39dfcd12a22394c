-- The history import on Citus (memchat.import_sessions, memchat.import_memories:
-- supabase/schemas/functions/import.sql, functions/memories.sql, which say
-- what they do). On plain PostgreSQL each kind of row goes in with one
-- INSERT ... SELECT from the request's JSON; Citus runs such a statement by
-- pulling its rows to the coordinator and copying them into the shards,
-- which PostgreSQL refuses under row-level security ("COPY FROM not
-- supported with row-level security"), and refuses an UPDATE ... FROM the
-- JSON outright. Here the JSON is read in statements that read no table,
-- and every row is written by a statement of its own, routed to the
-- caller's shard: the same rows, in the same order (a session's messages
-- get ascending ids in the file's order), under the same policies, limits
-- and triggers. Applied by `memchat db distribute` (memchat.store.distribute)
-- after the tables are distributed, and again by every later run
-- (`memchat migrate` runs it after any migration on a distributed database).

create or replace function memchat.import_sessions(
  p_user_id uuid, p_sessions jsonb, p_feedback jsonb, p_notes jsonb, p_ttl interval,
  p_request jsonb
) returns jsonb
language plpgsql
set search_path = ''
as $$
declare
  v_uid uuid := auth.uid();
  v_now timestamptz := now();
  v_expires timestamptz := memchat.session_expiry(p_ttl);
  v_given uuid[] := array(select g.id from jsonb_to_recordset(p_sessions) as g(id uuid));
  v_asked uuid[];
  v_live uuid[];
  v_stored uuid[] := '{}';
  v_ids bigint[] := '{}';
  v_owners uuid[] := '{}';
  v_ordinals bigint[];
  v_notes text[] := '{}';
  v_row record;
  v_id bigint;
  v_session uuid;
  v_agent text;
begin
  -- The caller as the API names it: on Citus the call is delegated by it
  -- to the worker holding that user's shards (`memchat db distribute`).
  if p_user_id is distinct from v_uid then
    raise exception 'the caller is not user %', p_user_id using errcode = '42501';
  end if;
  delete from public.chat_sessions s
   where s.user_id = v_uid and s.id = any(v_given) and s.expires_at <= v_now;

  if p_request is not null then
    v_asked := array(select r.id from jsonb_to_recordset(p_request) as r(id uuid));
    v_live := array(select s.id from public.chat_sessions s
                     where s.user_id = v_uid and s.id = any(v_asked) and s.expires_at > v_now);
    perform memchat.hold_stored_messages(
      (select coalesce(sum(r.messages), 0)::bigint
         from jsonb_to_recordset(p_request) as r(id uuid, messages bigint)
        where not r.id = any(v_live)));
  else
    v_live := array(select s.id from public.chat_sessions s
                     where s.user_id = v_uid and s.id = any(v_given));
    perform memchat.hold_stored_messages(
      (select coalesce(sum(jsonb_array_length(g.messages)), 0)::bigint
         from jsonb_to_recordset(p_sessions) as g(id uuid, messages jsonb)
        where not g.id = any(v_live)));
  end if;

  for v_row in
    select g.*, c.turns, c.prompt, c.completion
      from jsonb_to_recordset(p_sessions) as g(
             id uuid, agent_name text, title text, status text,
             created_at timestamptz, last_active_at timestamptz, messages jsonb)
      cross join lateral (
        select count(*) filter (where m.item->'message'->>'type' = 'human') as turns,
               coalesce(sum((m.item->'message'->'data'->'usage_metadata'->>'input_tokens')::bigint)
                          filter (where m.item->'message'->>'type' = 'ai'), 0) as prompt,
               coalesce(sum((m.item->'message'->'data'->'usage_metadata'->>'output_tokens')::bigint)
                          filter (where m.item->'message'->>'type' = 'ai'), 0) as completion
          from jsonb_array_elements(g.messages) as m(item)) c
  loop
    v_session := null;
    insert into public.chat_sessions as s
        (id, user_id, agent_name, title, status, message_count, created_at, last_active_at,
         expires_at, turn_count, prompt_tokens, completion_tokens)
    values (v_row.id, v_uid, v_row.agent_name, v_row.title, v_row.status,
            jsonb_array_length(v_row.messages), v_row.created_at, v_row.last_active_at,
            v_expires, v_row.turns, v_row.prompt, v_row.completion)
    on conflict (id, user_id) do nothing
    returning s.id into v_session;
    if v_session is not null then
      v_stored := v_stored || v_session;
    end if;
  end loop;

  for v_row in
    select g.id, m.item
      from jsonb_to_recordset(p_sessions) as g(id uuid, messages jsonb)
      cross join lateral jsonb_array_elements(g.messages) with ordinality as m(item, ord)
     where g.id = any(v_stored)
     order by g.id, m.ord
  loop
    insert into public.chat_message_history
        (session_id, user_id, message, client_message_id, created_at)
    values (v_row.id, v_uid, v_row.item->'message', v_row.item->>'client_message_id',
            (v_row.item->>'created_at')::timestamptz)
    returning id into v_id;
    v_ids := v_ids || v_id;
    v_owners := v_owners || v_row.id;
  end loop;

  -- What refers to a message by its place in its session (from 1), after
  -- the messages (the feedback's row-level security checks its message).
  v_ordinals := array(
    select row_number() over (partition by n.session_id order by n.id)
      from unnest(v_ids, v_owners) with ordinality as n(id, session_id, k)
     order by n.k);
  for v_row in
    select n.id, n.session_id, g.agent_name, f.rating, f.comment, f.created_at, f.updated_at
      from jsonb_to_recordset(p_feedback) as f(
             session_id uuid, ordinal bigint, rating smallint, comment text,
             created_at timestamptz, updated_at timestamptz)
      join unnest(v_ids, v_owners, v_ordinals) as n(id, session_id, ordinal)
        on n.session_id = f.session_id and n.ordinal = f.ordinal
      join jsonb_to_recordset(p_sessions) as g(id uuid, agent_name text) on g.id = n.session_id
  loop
    insert into memchat.message_feedback
        (message_id, user_id, session_id, agent_name, rating, comment, created_at, updated_at)
    values (v_row.id, v_uid, v_row.session_id, v_row.agent_name, v_row.rating, v_row.comment,
            coalesce(v_row.created_at, v_now), coalesce(v_row.updated_at, v_row.created_at, v_now));
  end loop;

  for v_row in
    select g.id, g.summary, n.id as covers_until, g.summary_covers, g.summary_updated_at
      from jsonb_to_recordset(p_sessions) as g(
             id uuid, summary text, summary_covers integer, summary_updated_at timestamptz)
      join unnest(v_ids, v_owners, v_ordinals) as n(id, session_id, ordinal)
        on n.session_id = g.id and n.ordinal = g.summary_covers
     where g.summary is not null
  loop
    update public.chat_sessions s
       set summary = v_row.summary, summary_covers_until = v_row.covers_until,
           summary_covers_count = v_row.summary_covers,
           summary_updated_at = v_row.summary_updated_at
     where s.id = v_row.id and s.user_id = v_uid;
  end loop;

  for v_row in
    select n.* from jsonb_to_recordset(p_notes) as n(
             agent_name text, notes text, created_at timestamptz, updated_at timestamptz)
  loop
    v_agent := null;
    insert into public.agent_long_term_memory as m
        (user_id, agent_name, notes, created_at, updated_at)
    values (v_uid, v_row.agent_name, v_row.notes, coalesce(v_row.created_at, v_now),
            coalesce(v_row.updated_at, v_row.created_at, v_now))
    on conflict (user_id, agent_name) do nothing
    returning m.agent_name into v_agent;
    if v_agent is not null then
      v_notes := v_notes || v_agent;
    end if;
  end loop;

  return jsonb_build_object('sessions', to_jsonb(v_stored), 'notes', to_jsonb(v_notes));
end
$$;

create or replace function memchat.import_memories(
  p_user_id uuid, p_memories jsonb, p_retention_days integer
)
returns integer
language plpgsql
security definer
set search_path = ''
as $$
declare
  v_user uuid := (select auth.uid());
  v_now timestamptz := now();
  v_row record;
  v_stored integer := 0;
begin
  if p_user_id is distinct from v_user then
    raise exception 'the caller is not user %', p_user_id using errcode = '42501';
  end if;
  if v_user is null or p_retention_days <= 0 then
    return 0;
  end if;
  for v_row in
    select distinct on (x.session_id, x.kind, x.text, x.created_at)
           x.agent_name, x.kind, x.text, x.session_id, x.created_at,
           least(coalesce(x.expires_at, 'infinity'),
                 v_now + make_interval(days => p_retention_days)) as expires_at
      from jsonb_to_recordset(p_memories)
           as x(agent_name text, kind text, text text, session_id uuid,
                created_at timestamptz, expires_at timestamptz)
     order by x.session_id, x.kind, x.text, x.created_at
  loop
    continue when v_row.expires_at <= v_now or exists (
      select 1 from memchat.memories m
       where m.user_id = v_user and m.session_id = v_row.session_id
         and m.kind = v_row.kind and m.text = v_row.text and m.created_at = v_row.created_at);
    insert into memchat.memories
        (user_id, agent_name, kind, text, session_id, message_id, ordinal, created_at,
         expires_at)
    values (v_user, v_row.agent_name, v_row.kind, v_row.text, v_row.session_id,
            nextval(pg_catalog.pg_get_serial_sequence('public.chat_message_history', 'id')),
            case v_row.kind when 'summary' then -1 else 0 end, v_row.created_at,
            v_row.expires_at);
    v_stored := v_stored + 1;
  end loop;
  return v_stored;
end
$$;
