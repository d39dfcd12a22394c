-- The rest of our SQL-language functions are PL/pgSQL too: none is planned
-- at every call on any PostgreSQL version (issue 22).
--
-- Migration *_plans_kept_everywhere.sql rewrote in PL/pgSQL the SQL functions
-- our PL/pgSQL functions call, because before PostgreSQL 18 (Supabase runs
-- 15 and 17) a SQL function the planner does not inline is parsed and
-- planned each time the statement calling it runs. These are the ones the
-- API and the workers call in their own statements: the stats, the
-- embedding backlog and queue, the two queues' claims and failures, and the
-- analytics key's padding (a column default). The client's statement is
-- planned at every call (no server-side prepared statements through the
-- transaction pooler), but it is one function call; the query inside is
-- now planned once per connection, as 18 already did.
--
-- Each is the same function in PL/pgSQL: the same arguments, result,
-- volatility, strictness, parallel safety, security and settings, the body
-- the statement it returned. Owners and grants are kept (create or
-- replace). What is left in SQL is what the planner inlines (auth.uid(),
-- memchat.embeddable, the set-returning helpers read in FROM) and the
-- zero-argument constants (tests/store/test_plans.py).

-- ------------------------------------------------------------ stats

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
      'avg_messages_per_session', coalesce(round(avg(s.message_count), 2), 0))
    from s);
end
$$;

create or replace function memchat.session_stats(p_session_id uuid) returns jsonb
language plpgsql stable
set search_path = ''
as $$
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
    where s.id = p_session_id and s.user_id = (select auth.uid()));
end
$$;

-- ------------------------------------------------- embeddings, the API's side

create or replace function memchat.queue_embeddings(p_session_ids uuid[]) returns integer
language plpgsql
set search_path = ''
as $$
declare
  v_mine integer;
begin
  with mine as (
    select s.id, s.user_id from public.chat_sessions s
     where s.id = any(p_session_ids) and s.user_id = (select auth.uid())
  ), queued as (
    insert into memchat.embedding_queue as q (session_id, user_id)
    select m.id, m.user_id from mine m
    on conflict (session_id, user_id) do update set attempts = 0, next_attempt_at = now()
     where q.next_attempt_at = 'infinity'
    returning 1
  )
  select count(*)::integer into v_mine from mine;
  return v_mine;
end
$$;

create or replace function memchat.embedding_backlog(out pending integer, out failed integer)
language plpgsql stable
set search_path = ''
as $$
begin
  select (count(*) filter (where q.next_attempt_at <> 'infinity'))::integer,
         (count(*) filter (where q.next_attempt_at = 'infinity'))::integer
    into pending, failed
    from memchat.embedding_queue q
    join public.chat_sessions s on s.id = q.session_id and s.user_id = q.user_id
    cross join lateral memchat.unembedded_messages(q.user_id, q.session_id, null) u
   where q.user_id = (select auth.uid())
     and s.status = 'active' and s.expires_at > now();
end
$$;

-- ----------------------------------------------- embeddings, the worker's

create or replace function memchat.embedding_claim(p_limit integer, p_lease_seconds double precision)
returns jsonb
language plpgsql
security definer
set search_path = ''
as $$
declare
  v_leased jsonb;
begin
  with due as (
    select d.session_id, d.user_id from memchat.embedding_queue d
     where d.next_attempt_at <= now()
     order by d.next_attempt_at
     limit p_limit
       for update skip locked
  ), leased as (
    update memchat.embedding_queue q
       set next_attempt_at = now() + make_interval(secs => p_lease_seconds),
           lease = gen_random_uuid()
      from due
     where q.session_id = due.session_id and q.user_id = due.user_id
    returning q.lease, q.session_id, q.attempts
  )
  select coalesce(jsonb_agg(jsonb_build_object(
           'lease', l.lease, 'session_id', l.session_id, 'attempts', l.attempts)), '[]'::jsonb)
    into v_leased
    from leased l;
  return v_leased;
end
$$;

create or replace function memchat.embedding_source(
  p_lease uuid, p_model text, p_after bigint, p_limit integer
) returns jsonb
language plpgsql stable
security definer
set search_path = ''
as $$
begin
  return (
    select coalesce(jsonb_agg(jsonb_build_object(
             'id', m.id, 'text', m.message->'data'->>'content',
             'embedded', exists (select 1 from memchat.message_embeddings e
                                  where e.message_id = m.id and e.user_id = m.user_id
                                    and e.model = p_model))
             order by m.id), '[]'::jsonb)
      from (select u.id, u.user_id, u.message
              from memchat.embedding_leased(p_lease) q
              join public.chat_sessions s on s.id = q.session_id and s.user_id = q.user_id
             cross join lateral memchat.unembedded_messages(q.user_id, q.session_id, p_model) u
             where s.status = 'active' and s.expires_at > now() and u.id > p_after
             order by u.id
             limit p_limit) m);
end
$$;

create or replace function memchat.embedding_save(
  p_leases uuid[], p_model text, p_ids bigint[], p_embeddings text[]
) returns integer
language plpgsql
security definer
set search_path = ''
as $$
declare
  v_stored integer;
begin
  with stored as (
    insert into memchat.message_embeddings as e
        (message_id, user_id, session_id, agent_name, created_at, model, embedding)
    select h.id, h.user_id, h.session_id, s.agent_name, h.created_at, p_model,
           x.embedding::extensions.vector
      from unnest(p_leases, p_ids, p_embeddings) as x(lease, id, embedding)
      join memchat.embedding_queue q on q.lease = x.lease and q.next_attempt_at > now()
      join public.chat_message_history h
        on h.id = x.id and h.user_id = q.user_id and h.session_id = q.session_id
      join public.chat_sessions s on s.id = q.session_id and s.user_id = q.user_id
     where memchat.embeddable(h.message) and p_model is not null
    on conflict (message_id, user_id) do update
       set model = excluded.model, embedding = excluded.embedding
     where e.model is distinct from excluded.model
    returning 1
  )
  select count(*)::integer into v_stored from stored;
  return v_stored;
end
$$;

-- A lease is one queue item's (gen_random_uuid() per claimed row).
create or replace function memchat.embedding_failed(p_lease uuid, p_retry_in double precision)
returns integer
language plpgsql
security definer
set search_path = ''
as $$
declare
  v_attempts integer;
begin
  update memchat.embedding_queue q
     set attempts = q.attempts + 1,
         lease = null,
         next_attempt_at = case when p_retry_in is null then 'infinity'::timestamptz
                                else now() + make_interval(secs => p_retry_in) end
   where q.lease = p_lease and q.next_attempt_at > now()
  returning q.attempts into v_attempts;
  return v_attempts;
end
$$;

-- ------------------------------------------------- summaries, the worker's

create or replace function memchat.summary_claim(p_limit integer, p_lease_seconds double precision)
returns jsonb
language plpgsql
security definer
set search_path = ''
as $$
declare
  v_leased jsonb;
begin
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
    into v_leased
    from leased l;
  return v_leased;
end
$$;

create or replace function memchat.summary_failed(p_lease uuid, p_retry_in double precision)
returns integer
language plpgsql
security definer
set search_path = ''
as $$
declare
  v_attempts integer;
begin
  update memchat.summary_queue q
     set attempts = q.attempts + 1,
         lease = null,
         next_attempt_at = case when p_retry_in is null then 'infinity'::timestamptz
                                else now() + make_interval(secs => p_retry_in) end
   where q.lease = p_lease and q.next_attempt_at > now()
  returning q.attempts into v_attempts;
  return v_attempts;
end
$$;

create or replace function memchat.summary_lag() returns double precision
language plpgsql stable
security definer
set search_path = ''
as $$
begin
  return (select extract(epoch from now() - min(q.due_since))::double precision
            from memchat.summary_queue q where q.next_attempt_at <> 'infinity');
end
$$;

-- ------------------------------------------------------------ the secret

create or replace function memchat.analytics_key_pad(p_key bytea, p_pad integer) returns bytea
language plpgsql immutable strict parallel safe
set search_path = ''
as $$
begin
  return (
    select string_agg(
             set_byte('\x00'::bytea, 0,
                      (case when i < octet_length(p_key) then get_byte(p_key, i) else 0 end)
                      # p_pad),
             ''::bytea order by i)
      from generate_series(0, 63) as i);
end
$$;
