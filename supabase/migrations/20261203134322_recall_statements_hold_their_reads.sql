-- Written by `memchat db diff`: what supabase/schemas has that the
-- migrations before this one did not make:
--   function memchat.answer_after(uuid,uuid,bigint)
--   function memchat.nearest_message_ids(uuid,text,text,uuid,bigint,extensions.vector,integer,timestamp with time zone,timestamp with time zone)
--   function memchat.nearest_messages(uuid,text,text,uuid,bigint,extensions.vector,integer,timestamp with time zone,timestamp with time zone) (dropped)
--   function memchat.recall(uuid,text,integer,extensions.vector,text,text,integer,double precision,double precision,timestamp with time zone,timestamp with time zone) (dropped)
--   function memchat.recall(uuid,uuid,text,integer,extensions.vector,text,text,integer,double precision,double precision,timestamp with time zone,timestamp with time zone)
--   function memchat.recall_hits(bigint[],double precision[],uuid,bigint)
--   function memchat.recall_keys(uuid,text,text,uuid,bigint) (dropped)
--   function memchat.recall_memories(text,extensions.vector,text,text,integer,double precision) (dropped)
--   function memchat.recall_memories(uuid,text,extensions.vector,text,text,integer,double precision)
--   privileges on function memchat.nearest_message_ids(uuid,text,text,uuid,bigint,extensions.vector,integer,timestamp with time zone,timestamp with time zone)
--   privileges on function memchat.recall(uuid,uuid,text,integer,extensions.vector,text,text,integer,double precision,double precision,timestamp with time zone,timestamp with time zone)
--   privileges on function memchat.recall_memories(uuid,text,extensions.vector,text,text,integer,double precision)

set local check_function_bodies = off;

CREATE OR REPLACE FUNCTION memchat.answer_after(p_user_id uuid, p_session_id uuid, p_message_id bigint)
 RETURNS TABLE(content text)
 LANGUAGE plpgsql
 STABLE
 SET search_path TO ''
AS $function$
begin
  return query
    select pg_catalog.string_agg(x.message->'data'->>'content', E'\n\n' order by x.id)
      from public.chat_message_history x
     where x.user_id = p_user_id and x.session_id = p_session_id and x.id > p_message_id
       and x.id < coalesce((select n.id from public.chat_message_history n
                             where n.user_id = p_user_id and n.session_id = p_session_id
                               and n.id > p_message_id and memchat.asked(n.message)
                             order by n.id
                             limit 1), 9223372036854775807)
       and x.message->>'type' = 'ai' and memchat.embeddable(x.message)
    having pg_catalog.count(*) > 0;
end
$function$;

CREATE OR REPLACE FUNCTION memchat.nearest_message_ids(p_uid uuid, p_agent_name text, p_model text, p_session_id uuid, p_floor bigint, p_query extensions.vector, p_depth integer, p_from timestamp with time zone, p_until timestamp with time zone)
 RETURNS bigint[]
 LANGUAGE plpgsql
 STABLE
 SET search_path TO ''
AS $function$
begin
  return array(
    select k.message_id
      from (select k.message_id, k.embedding operator(extensions.<=>) p_query as distance
              from (select coalesce(e.exchange_id, e.message_id) as message_id, e.created_at,
                           e.embedding
                      from memchat.message_embeddings e
                      join public.chat_sessions s on s.id = e.session_id and s.user_id = p_uid
                     where e.user_id = p_uid and e.agent_name = p_agent_name
                       and e.model = p_model
                       and s.status = 'active' and s.expires_at > pg_catalog.now()
                       and (p_session_id is null or e.session_id <> p_session_id
                            or e.message_id < p_floor)
                    union all
                    select f.message_id, f.created_at, f.embedding
                      from memchat.message_facts f
                      join public.chat_sessions s on s.id = f.session_id and s.user_id = p_uid
                     where f.user_id = p_uid and f.agent_name = p_agent_name
                       and f.model = p_model
                       and s.status = 'active' and s.expires_at > pg_catalog.now()
                       and (p_session_id is null or f.session_id <> p_session_id
                            or f.message_id < p_floor)) k
             where k.created_at >= coalesce(p_from, '-infinity')
               and k.created_at < coalesce(p_until, 'infinity')
             order by distance
             limit p_depth * 3) k
     group by k.message_id
     order by min(k.distance), k.message_id desc
     limit p_depth);
end
$function$;

drop function if exists memchat.nearest_messages(uuid,text,text,uuid,bigint,extensions.vector,integer,timestamp with time zone,timestamp with time zone);

drop function if exists memchat.recall(uuid,text,integer,extensions.vector,text,text,integer,double precision,double precision,timestamp with time zone,timestamp with time zone);

CREATE OR REPLACE FUNCTION memchat.recall(p_user_id uuid, p_session_id uuid, p_agent_name text, p_window integer, p_query extensions.vector, p_model text, p_text text, p_k integer, p_min_score double precision, p_collapse double precision, p_from timestamp with time zone, p_until timestamp with time zone)
 RETURNS jsonb
 LANGUAGE plpgsql
 STABLE
 SET search_path TO ''
 SET enable_bitmapscan TO 'off'
 SET enable_sort TO 'on'
 SET enable_nestloop TO 'on'
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
declare
  v_uid uuid := auth.uid();
  v_near_ids bigint[];
  v_near_sessions uuid[];
  v_near_distances double precision[];
  v_floor bigint := 9223372036854775807;
  v_words tsquery := memchat.any_words(p_text);
  v_depth integer := greatest(p_k * 2, 20);
  v_messages bigint := 0;
  v_table_rows real;
  v_meaning bigint[] := '{}';
  v_matching bigint[] := '{}';
  v_period bigint[] := '{}';
  v_kept extensions.vector[] := '{}';
  v_ids bigint[] := '{}';
  v_scores double precision[] := '{}';
  v_candidate record;
  -- The candidates left after the floor and the collapse, best fused first.
  v_pool_ids bigint[] := '{}';
  v_pool_fused double precision[] := '{}';
  v_pool_scores double precision[] := '{}';
  v_pool_sessions uuid[] := '{}';
  v_sessions uuid[] := '{}';
  v_best integer;
  v_best_value double precision;
  v_value double precision;
  v_bound double precision;
  v_cursor refcursor;
begin
  -- The caller as the API names it: on Citus the call is delegated by it
  -- to the worker holding that user's shards (`memchat db distribute`).
  if p_user_id is distinct from v_uid then
    raise exception 'the caller is not user %', p_user_id using errcode = '42501';
  end if;
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
    select coalesce(min(w.id), v_floor) into v_floor
      from (select h.id from public.chat_message_history h
             where h.user_id = v_uid and h.session_id = p_session_id
               and h.message->>'type' <> 'tool'
               and coalesce(jsonb_array_length(h.message->'data'->'tool_calls'), 0) = 0
             order by h.id desc
             limit p_window) w;
  end if;
  -- The history's length, from the sessions' counters (one row per session).
  select coalesce(sum(s.message_count), 0) into v_messages
    from public.chat_sessions s
   where s.user_id = v_uid and s.agent_name = p_agent_name
     and s.status = 'active' and s.expires_at > now();

  -- An exchange is as near as its nearest key (its question's, an answer's, a fact's).
  if v_messages >= memchat.ann_from_messages() and memchat.recall_index_ready() then
    -- The rows of the caller's partition as the statistics know them (-1:
    -- never analysed): the HNSW scan runs in that partition's index only.
    select c.reltuples into v_table_rows
      from pg_catalog.pg_class c
     where c.oid = memchat.key_partition_of('message_embeddings', v_uid);
  end if;
  if v_table_rows is not null
     and (v_table_rows < 0
          or (v_messages / 2.0) ^ 2 > 4.0 * (v_depth * 3 + p_window) * v_table_rows) then
    -- The HNSW indexes, each scan going on until it has its rows of the
    -- caller's (relaxed order: re-sorted here). Sorting is off while the
    -- statements are planned (memchat.nearest_keys_indexed's too), so that
    -- the planner cannot read the owner index and sort instead, which is
    -- the exact scan's cost.
    perform set_config('hnsw.iterative_scan', 'relaxed_order', true),
            set_config('hnsw.ef_search',
                       memchat.recall_ef_search(v_table_rows, v_messages / 2)::text, true),
            set_config('enable_sort', 'off', true),
            set_config('enable_seqscan', 'off', true);
    -- The keys first, in a statement that reads no table itself (on Citus,
    -- a function reading a distributed table cannot run inside one that
    -- does), then those in live sessions outside the window.
    select coalesce(array_agg(n.message_id), '{}'), coalesce(array_agg(n.session_id), '{}'),
           coalesce(array_agg(n.distance), '{}')
      into v_near_ids, v_near_sessions, v_near_distances
      from memchat.nearest_keys_indexed(v_uid, p_agent_name, p_model, p_query,
                                        v_depth + p_window) n;
    v_meaning := array(
      select n.message_id
        from unnest(v_near_ids, v_near_sessions, v_near_distances) n(message_id, session_id,
                                                                      distance)
        join public.chat_sessions s on s.id = n.session_id and s.user_id = v_uid
       where s.status = 'active' and s.expires_at > pg_catalog.now()
         and (p_session_id is null or n.session_id <> p_session_id or n.message_id < v_floor)
       group by n.message_id
       order by min(n.distance), n.message_id desc
       limit v_depth);
    perform set_config('enable_sort', 'on', true),
            set_config('enable_seqscan', 'on', true),
            set_config('hnsw.iterative_scan', 'off', true);
  end if;
  -- The exact scans hash the caller's live sessions (above): no nested
  -- loop that reads the caller's keys once per session.
  perform set_config('enable_nestloop', 'off', true);
  -- Fewer than k from the indexes (the scans stopped at
  -- hnsw.max_scan_tuples before finding the caller's rows): the exact scan.
  -- Fewer than the list's depth but k or more (the nearest keys belong to
  -- fewer messages) is a shorter list, not a reason to read every row.
  if cardinality(v_meaning) < least(v_depth, p_k) then
    -- The exact scan: the owner index read in order (bitmap scans off,
    -- this function's setting).
    v_meaning := memchat.nearest_message_ids(
      v_uid, p_agent_name, p_model, p_session_id, v_floor, p_query, v_depth, null, null);
  end if;
  if p_from is not null or p_until is not null then
    v_period := memchat.nearest_message_ids(
      v_uid, p_agent_name, p_model, p_session_id, v_floor, p_query, v_depth, p_from, p_until);
  end if;
  perform set_config('enable_nestloop', 'on', true);
  if v_words is not null then
    v_words := memchat.rarer_words(v_words, v_messages / 2, memchat.words_budget());
    v_matching := memchat.rounds_matching(p_agent_name, p_model, v_words, p_session_id, v_floor,
                                          v_depth, v_messages / 2);
  end if;

  -- Reciprocal rank fusion with k = 20: the lists' first places weigh more
  -- than with the customary 60, so that an exchange first by meaning and
  -- first in the period is not outranked by one that is middling in all
  -- three lists (measured on LongMemEval, docs/benchmarks.md). The
  -- candidates come best fused first, each with its similarity to the query
  -- (its own embedding's or its nearest fact key's) computed as it is
  -- fetched (its question's, an answer's or a fact key's, the nearest).
  open v_cursor for
    select f.id as message_id, f.fused::double precision as fused, e.session_id, e.embedding,
           e.score
      from (select l.id, sum(1.0 / (20 + l.r)) as fused
              from (select * from unnest(v_meaning) with ordinality as a(id, r)
                    union all select * from unnest(v_matching) with ordinality as b(id, r)
                    union all select * from unnest(v_period) with ordinality as c(id, r)) l
             group by l.id
             order by 2 desc, 1 desc) f
      cross join lateral (
        select x.session_id, x.embedding,
               1 - least(x.embedding operator(extensions.<=>) p_query,
                         (select min(k.embedding operator(extensions.<=>) p_query)
                            from memchat.message_facts k
                           where k.message_id = f.id and k.user_id = v_uid
                             and k.model = p_model),
                         (select min(y.embedding operator(extensions.<=>) p_query)
                            from memchat.message_embeddings y
                           where y.exchange_id = f.id and y.user_id = v_uid
                             and y.model = p_model)) as score
          from memchat.message_embeddings x
         where x.message_id = f.id and x.user_id = v_uid
        offset 0) e
     order by f.fused desc, f.id desc;
  loop
    fetch v_cursor into v_candidate;
    -- No later candidate is worth more than its fused score.
    v_bound := case when found then v_candidate.fused else -1 end;
    -- The k best, each candidate's fused score worth 0.9 times less for
    -- every hit already taken from its session: several sessions that each
    -- say something come before one session saying it again (a question
    -- about "how many", "which first" needs them all), while a session
    -- holding several good exchanges still gives them. A pick is taken once
    -- no later candidate can change it: the pool's best value is at least
    -- the bound (a later candidate would lose the tie).
    loop
      exit when cardinality(v_ids) >= p_k;
      v_best := null;
      v_best_value := -1;
      for i in 1 .. coalesce(cardinality(v_pool_ids), 0) loop
        continue when v_pool_ids[i] = any(v_ids);
        v_value := v_pool_fused[i]
                   * 0.9 ^ coalesce(cardinality(array_positions(v_sessions, v_pool_sessions[i])), 0);
        if v_value > v_best_value then
          v_best := i;
          v_best_value := v_value;
        end if;
      end loop;
      exit when v_best is null or v_best_value < v_bound;
      v_ids := v_ids || v_pool_ids[v_best];
      v_scores := v_scores || v_pool_scores[v_best];
      v_sessions := v_sessions || v_pool_sessions[v_best];
    end loop;
    exit when v_bound < 0 or cardinality(v_ids) >= p_k;
    -- Into the pool: above the floor, and not the same memory as one kept.
    continue when v_candidate.score < p_min_score;
    continue when exists (
      select 1 from unnest(v_kept) k(v)
       where 1 - (k.v operator(extensions.<=>) v_candidate.embedding) >= p_collapse);
    v_kept := v_kept || v_candidate.embedding;
    v_pool_ids := v_pool_ids || v_candidate.message_id;
    v_pool_fused := v_pool_fused || v_candidate.fused;
    v_pool_scores := v_pool_scores || v_candidate.score;
    v_pool_sessions := v_pool_sessions || v_candidate.session_id;
  end loop;
  close v_cursor;

  return memchat.recall_hits(v_ids, v_scores, p_session_id, v_floor);
end
$function$;

CREATE OR REPLACE FUNCTION memchat.recall_hits(p_ids bigint[], p_scores double precision[], p_session_id uuid, p_floor bigint)
 RETURNS jsonb
 LANGUAGE plpgsql
 STABLE
 SET search_path TO ''
AS $function$
declare
  -- The caller, a parameter of the statement: on Citus, its shard.
  v_uid uuid := auth.uid();
begin
  return coalesce((
    select jsonb_agg(jsonb_build_object(
             'message_id', h.id,
             'session_id', h.session_id,
             'created_at', h.created_at,
             'score', hit.score,
             'title', s.title,
             'question', case when memchat.asked(h.message)
                              then left(h.message->'data'->>'content', 2000) else '' end,
             'answer', left(case when memchat.asked(h.message) then answers.of[1]
                                 else h.message->'data'->>'content' end, 2000),
             'before', case when b.id is not null then jsonb_build_object(
               'message_id', b.id,
               'question', left(b.message->'data'->>'content', 1000),
               'answer', left(answers.of[2], 1000)) end,
             'after', case when a.id is not null then jsonb_build_object(
               'message_id', a.id,
               'question', left(a.message->'data'->>'content', 1000),
               'answer', left(answers.of[3], 1000)) end)
           order by hit.ord)
      from unnest(p_ids, p_scores) with ordinality as hit(id, score, ord)
      join public.chat_message_history h on h.id = hit.id and h.user_id = v_uid
      join public.chat_sessions s on s.id = h.session_id and s.user_id = v_uid
      -- The exchange before it in its session (its neighbour): what the hit
      -- often answers or goes on from.
      left join lateral (
           select x.id, x.message from public.chat_message_history x
            where x.user_id = v_uid and x.session_id = h.session_id and x.id < h.id
              and memchat.asked(x.message)
            order by x.id desc limit 1) b on true
      -- The exchange after it: what often answers or corrects it. In the
      -- turn's session, not one of the window's (the prompt shows those).
      left join lateral (
           select x.id, x.message from public.chat_message_history x
            where x.user_id = v_uid and x.session_id = h.session_id and x.id > h.id
              and (p_session_id is null or x.session_id <> p_session_id or x.id < p_floor)
              and memchat.asked(x.message)
            order by x.id limit 1) a on true
      -- The answers to the hit, to the exchange before it and to the one
      -- after it, in that order (null: none, or no such exchange): the
      -- assistant's messages with text after each up to the next user
      -- message, as memchat.answer_after reads them.
      cross join lateral (
           select array_agg(y.content order by q.n) as of
             from unnest(array[h.id, b.id, a.id]) with ordinality q(id, n)
             left join lateral (
                  select pg_catalog.string_agg(x.message->'data'->>'content', E'\n\n'
                                               order by x.id) as content
                    from public.chat_message_history x
                   where x.user_id = v_uid and x.session_id = h.session_id and x.id > q.id
                     and x.id < coalesce((select n.id from public.chat_message_history n
                                           where n.user_id = v_uid
                                             and n.session_id = h.session_id
                                             and n.id > q.id and memchat.asked(n.message)
                                           order by n.id
                                           limit 1), 9223372036854775807)
                     and x.message->>'type' = 'ai' and memchat.embeddable(x.message)
                  having pg_catalog.count(*) > 0) y on true) answers
     where h.user_id = v_uid),
    '[]'::jsonb);
end
$function$;

drop function if exists memchat.recall_keys(uuid,text,text,uuid,bigint);

drop function if exists memchat.recall_memories(text,extensions.vector,text,text,integer,double precision);

CREATE OR REPLACE FUNCTION memchat.recall_memories(p_user_id uuid, p_agent_name text, p_query extensions.vector, p_model text, p_text text, p_limit integer, p_min_score double precision)
 RETURNS jsonb
 LANGUAGE plpgsql
 STABLE
 SET search_path TO ''
AS $function$
declare
  -- The caller, a parameter of each statement: on Citus, its shard.
  v_uid uuid := auth.uid();
  v_ids bigint[];
  v_scores double precision[];
begin
  if p_user_id is distinct from v_uid then
    raise exception 'the caller is not user %', p_user_id using errcode = '42501';
  end if;
  if not exists (select 1 from memchat.memories m
                  where m.user_id = v_uid and m.agent_name = p_agent_name
                    and m.expires_at is not null) then
    return '[]'::jsonb;
  end if;
  -- The matches first, in a statement that reads no table itself (on
  -- Citus, a function reading a distributed table cannot run inside one
  -- that does).
  select array_agg(f.id order by f.ordinality), array_agg(f.score order by f.ordinality)
    into v_ids, v_scores
    from memchat.search_memories(p_agent_name, p_query, p_model, p_text, p_limit,
                                 p_min_score, true) with ordinality f;
  return (
    select coalesce(jsonb_agg(jsonb_build_object(
             'memory_id', m.id, 'kind', m.kind, 'text', m.text, 'session_id', m.session_id,
             'message_id', m.message_id, 'created_at', m.created_at, 'score', f.score)
             order by f.ord), '[]'::jsonb)
      from unnest(v_ids, v_scores) with ordinality f(id, score, ord)
      join memchat.memories m on m.id = f.id and m.user_id = v_uid);
end
$function$;

revoke all on function memchat.nearest_message_ids(uuid,text,text,uuid,bigint,extensions.vector,integer,timestamp with time zone,timestamp with time zone) from public;

grant execute on function memchat.nearest_message_ids(uuid,text,text,uuid,bigint,extensions.vector,integer,timestamp with time zone,timestamp with time zone) to memchat_user;

revoke all on function memchat.recall(uuid,uuid,text,integer,extensions.vector,text,text,integer,double precision,double precision,timestamp with time zone,timestamp with time zone) from public;

grant execute on function memchat.recall(uuid,uuid,text,integer,extensions.vector,text,text,integer,double precision,double precision,timestamp with time zone,timestamp with time zone) to memchat_user;

revoke all on function memchat.recall_memories(uuid,text,extensions.vector,text,text,integer,double precision) from public;

grant execute on function memchat.recall_memories(uuid,text,extensions.vector,text,text,integer,double precision) to memchat_user;
