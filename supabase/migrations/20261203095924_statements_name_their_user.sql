-- Written by `memchat db diff`: what supabase/schemas has that the
-- migrations before this one did not make:
--   function memchat.chat_stats(text)
--   function memchat.embedding_backlog()
--   function memchat.index_round()
--   function memchat.queue_embeddings(uuid[])
--   function memchat.recall_memories(text,extensions.vector,text,text,integer,double precision)
--   function memchat.restore_notes(text,integer,integer)
--   function memchat.save_notes(text,text,integer)
--   function memchat.search_memories(text,extensions.vector,text,text,integer,double precision,boolean)
--   function memchat.session_stats(uuid)
--   function memchat.stored_messages()

set local check_function_bodies = off;

CREATE OR REPLACE FUNCTION memchat.chat_stats(p_agent_name text)
 RETURNS jsonb
 LANGUAGE plpgsql
 STABLE
 SET search_path TO ''
AS $function$
declare
  -- The caller, a parameter of each statement: on Citus, its shard.
  v_uid uuid := auth.uid();
begin
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
          'stored_messages', memchat.stored_messages(),
          'max_stored_messages', memchat.max_stored_messages()))
    from s);
end
$function$;

CREATE OR REPLACE FUNCTION memchat.embedding_backlog(OUT pending integer, OUT failed integer)
 RETURNS record
 LANGUAGE plpgsql
 STABLE
 SET search_path TO ''
AS $function$
declare
  -- The caller, a parameter of each statement: on Citus, its shard.
  v_uid uuid := auth.uid();
begin
  select (count(*) filter (where q.next_attempt_at <> 'infinity'))::integer,
         (count(*) filter (where q.next_attempt_at = 'infinity'))::integer
    into pending, failed
    from memchat.embedding_queue q
    join public.chat_sessions s on s.id = q.session_id and s.user_id = q.user_id
    cross join lateral memchat.unembedded_messages(q.user_id, q.session_id, null) u
   where q.user_id = v_uid
     and s.status = 'active' and s.expires_at > now();
end
$function$;

CREATE OR REPLACE FUNCTION memchat.index_round()
 RETURNS trigger
 LANGUAGE plpgsql
 SET search_path TO ''
AS $function$
declare
  -- now() itself in ON CONFLICT DO UPDATE: refused by Citus (docs/deploy.md).
  v_now timestamptz := now();
  v_message jsonb;
  v_answer text;
begin
  -- Each read by the row's user_id too: on Citus, its own shard.
  select h.message into v_message
    from public.chat_message_history h
   where h.id = new.message_id and h.user_id = new.user_id;
  if v_message->>'type' = 'ai' then
    new.facts_model := new.model;
    new.exchange_id := (
      select x.id from public.chat_message_history x
       where x.user_id = new.user_id and x.session_id = new.session_id
         and x.id < new.message_id and memchat.asked(x.message)
       order by x.id desc
       limit 1);
    new.lexemes := case when new.exchange_id is null then memchat.owned_lexemes(
                     memchat.round_lexemes(null, v_message->'data'->>'content'), new.user_id) end;
    return new;
  end if;
  v_answer := (select a.content
                 from memchat.answer_after(new.user_id, new.session_id, new.message_id) a);
  new.exchange_id := null;
  new.lexemes := memchat.owned_lexemes(
    memchat.round_lexemes(v_message->'data'->>'content', v_answer), new.user_id);
  -- The backfill reads every user message once: its fact keys, and what
  -- durable memory keeps of it (functions/memories.sql).
  new.facts_model := null;
  insert into memchat.embedding_queue as q (session_id, user_id)
  values (new.session_id, new.user_id)
  on conflict (session_id, user_id) do update set attempts = 0, next_attempt_at = v_now
   where q.next_attempt_at = 'infinity';
  return new;
end
$function$;

CREATE OR REPLACE FUNCTION memchat.queue_embeddings(p_session_ids uuid[])
 RETURNS integer
 LANGUAGE plpgsql
 SET search_path TO ''
AS $function$
declare
  -- The caller, a parameter of each statement: on Citus, its shard.
  v_uid uuid := auth.uid();
  -- now() itself in ON CONFLICT DO UPDATE: refused by Citus (docs/deploy.md).
  v_now timestamptz := now();
  v_mine integer;
begin
  with mine as (
    select s.id, s.user_id from public.chat_sessions s
     where s.id = any(p_session_ids) and s.user_id = v_uid
  ), queued as (
    insert into memchat.embedding_queue as q (session_id, user_id)
    select m.id, m.user_id from mine m
    on conflict (session_id, user_id) do update set attempts = 0, next_attempt_at = v_now
     where q.next_attempt_at = 'infinity'
    returning 1
  )
  select count(*)::integer into v_mine from mine;
  return v_mine;
end
$function$;

CREATE OR REPLACE FUNCTION memchat.recall_memories(p_agent_name text, p_query extensions.vector, p_model text, p_text text, p_limit integer, p_min_score double precision)
 RETURNS jsonb
 LANGUAGE plpgsql
 STABLE
 SET search_path TO ''
AS $function$
declare
  -- The caller, a parameter of each statement: on Citus, its shard.
  v_uid uuid := auth.uid();
begin
  if not exists (select 1 from memchat.memories m
                  where m.user_id = v_uid and m.agent_name = p_agent_name
                    and m.expires_at is not null) then
    return '[]'::jsonb;
  end if;
  return (
    select coalesce(jsonb_agg(jsonb_build_object(
             'memory_id', m.id, 'kind', m.kind, 'text', m.text, 'session_id', m.session_id,
             'message_id', m.message_id, 'created_at', m.created_at, 'score', f.score)
             order by f.ordinality), '[]'::jsonb)
      from memchat.search_memories(p_agent_name, p_query, p_model, p_text, p_limit,
                                   p_min_score, true) with ordinality f
      join memchat.memories m on m.id = f.id and m.user_id = v_uid);
end
$function$;

CREATE OR REPLACE FUNCTION memchat.restore_notes(p_agent_name text, p_version integer, p_expected_version integer)
 RETURNS integer
 LANGUAGE plpgsql
 SET search_path TO ''
AS $function$
declare
  -- The caller, a parameter of each statement: on Citus, its shard.
  v_uid uuid := auth.uid();
  v_notes text;
begin
  select v.notes into v_notes from memchat.notes_versions v
   where v.user_id = v_uid and v.agent_name = p_agent_name
     and v.version = p_version;
  if not found then
    return null;
  end if;
  return memchat.save_notes(p_agent_name, v_notes, p_expected_version);
end
$function$;

CREATE OR REPLACE FUNCTION memchat.save_notes(p_agent_name text, p_notes text, p_expected_version integer)
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

CREATE OR REPLACE FUNCTION memchat.search_memories(p_agent_name text, p_query extensions.vector, p_model text, p_text text, p_limit integer, p_min_score double precision, p_durable boolean)
 RETURNS TABLE(id bigint, score double precision)
 LANGUAGE plpgsql
 STABLE
 SET search_path TO ''
AS $function$
declare
  -- The caller, a parameter of each statement: on Citus, its shard.
  v_uid uuid := auth.uid();
  v_words tsquery;
  v_lexemes text[];
  v_ids bigint[];
  v_current boolean;
begin
  if p_durable then
    select array_agg(m.id) into v_ids from memchat.memories m
     where m.user_id = v_uid and m.agent_name = p_agent_name
       and m.expires_at is not null;
  else
    select array_agg(m.id) into v_ids from memchat.memories m
     where m.user_id = v_uid and m.agent_name = p_agent_name;
  end if;
  if v_ids is null then
    return;  -- none: the words are not even looked at
  end if;
  v_words := memchat.any_words(p_text);
  v_lexemes := pg_catalog.tsvector_to_array(pg_catalog.to_tsvector('english'::regconfig, coalesce(p_text, '')));
  v_current := p_text ~* '\m(now|current|currently|latest|still|these days|most recent|recently|anymore|at the moment|presently|so far)\M';
  return query
  with own as materialized (
    select m.id, m.model, m.embedding, m.lexemes, m.created_at, m.session_id
      from memchat.memories m
     where m.user_id = v_uid and m.id = any(v_ids)
  ), meaning as (
    select o.id, row_number() over (order by o.embedding operator(extensions.<=>) p_query, o.id desc)
             as r
      from own o
     where p_query is not null and o.model = p_model
     order by r
     limit p_limit * 2
  ), matching as materialized (
    select o.id, l.lexeme
      from own o
     cross join lateral unnest(pg_catalog.tsvector_to_array(o.lexemes)) l(lexeme)
     where v_words is not null and o.lexemes operator(pg_catalog.@@) v_words
       and l.lexeme = any(v_lexemes)
  ), rarity as (
    select m.lexeme,
           ln(1 + (cardinality(v_ids) - count(*) + 0.5) / (count(*) + 0.5)) as weight
      from matching m
     group by m.lexeme
  ), words as (
    select m.id, row_number() over (order by sum(w.weight) desc, m.id desc) as r
      from matching m
      join rarity w on w.lexeme = m.lexeme
     group by m.id
     order by r
     limit p_limit * 2
  ), fused as (
    select coalesce(a.id, b.id) as id,
           coalesce(1.0 / (20 + a.r), 0) + coalesce(1.0 / (20 + b.r), 0) as fused
      from meaning a
      full join words b on b.id = a.id
  ), kept as (
    select f.id, f.fused, x.similarity, o.embedding, o.created_at, o.session_id
      from fused f
      join own o on o.id = f.id
     cross join lateral (
       select case when p_query is not null and o.model = p_model
                   then 1 - (o.embedding operator(extensions.<=>) p_query) end as similarity) x
     where p_query is null or x.similarity >= p_min_score
  ), found as materialized (
    select k.id, k.fused * 0.9 ^ (row_number() over (partition by k.session_id
                                                    order by k.fused desc, k.id desc) - 1)
             as fused,
           k.similarity, k.embedding, k.created_at, k.session_id
      from kept k
     order by 2 desc, k.id desc
     limit p_limit
  )
  select a.id, a.similarity
    from found a
   cross join lateral (
     select max(b.fused) as fused
       from found b
      where b.id = a.id
         or (v_current and a.similarity is not null and b.similarity is not null
             and b.session_id <> a.session_id
             and 1 - (a.embedding operator(extensions.<=>) b.embedding)
                 >= greatest(a.similarity, b.similarity) - 0.1)) pair
   order by pair.fused desc, a.created_at desc, a.id desc;
end
$function$;

CREATE OR REPLACE FUNCTION memchat.session_stats(p_session_id uuid)
 RETURNS jsonb
 LANGUAGE plpgsql
 STABLE
 SET search_path TO ''
AS $function$
declare
  -- The caller, a parameter of each statement: on Citus, its shard.
  v_uid uuid := auth.uid();
begin
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
          from memchat.message_feedback f where f.session_id = s.id),
      'first_activity_at', s.created_at,
      'last_activity_at', s.last_active_at,
      'duration_seconds', round(extract(epoch from s.last_active_at - s.created_at)::numeric, 3))
    from public.chat_sessions s
    where s.id = p_session_id and s.user_id = v_uid);
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
begin
  return (select coalesce(sum(s.message_count), 0)::bigint from public.chat_sessions s
           where s.user_id = v_uid and s.expires_at > now());
end
$function$;
