-- Recall finds an exchange by what either side said: the assistant's
-- messages are embedded too, each a key of the exchange it answers
-- (message_embeddings.exchange_id), and an assistant message no user
-- message came before is an exchange of its own (supabase/schemas:
-- tables/recall_keys.sql, functions/recall.sql, functions/words.sql,
-- functions/embeddings.sql).

alter table memchat.message_embeddings add column if not exists exchange_id bigint;
create index if not exists message_embeddings_exchange_idx on memchat.message_embeddings (exchange_id)
  where exchange_id is not null;


set local check_function_bodies = off;

CREATE OR REPLACE FUNCTION memchat.answer_after(p_user_id uuid, p_session_id uuid, p_message_id bigint)
 RETURNS TABLE(content text)
 LANGUAGE sql
 STABLE
AS $function$
  select pg_catalog.string_agg(x.message->'data'->>'content', E'\n\n' order by x.id)
    from public.chat_message_history x
   where x.user_id = p_user_id and x.session_id = p_session_id and x.id > p_message_id
     and x.id < coalesce((select n.id from public.chat_message_history n
                           where n.user_id = p_user_id and n.session_id = p_session_id
                             and n.id > p_message_id and memchat.asked(n.message)
                           order by n.id
                           limit 1), 9223372036854775807)
     and x.message->>'type' = 'ai' and memchat.embeddable(x.message)
  having pg_catalog.count(*) > 0
$function$;

CREATE OR REPLACE FUNCTION memchat.asked(p_message jsonb)
 RETURNS boolean
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $function$
  select p_message->>'type' = 'human'
     and jsonb_typeof(p_message->'data'->'content') = 'string'
     and p_message->'data'->>'content' ~ '\S'
$function$;

CREATE OR REPLACE FUNCTION memchat.embeddable(p_message jsonb)
 RETURNS boolean
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $function$
  select p_message->>'type' in ('human', 'ai')
     and jsonb_typeof(p_message->'data'->'content') = 'string'
     and p_message->'data'->>'content' ~ '\S'
     and coalesce(jsonb_array_length(p_message->'data'->'tool_calls'), 0) = 0
$function$;

CREATE OR REPLACE FUNCTION memchat.embedding_source(p_lease uuid, p_model text, p_after bigint, p_limit integer)
 RETURNS jsonb
 LANGUAGE plpgsql
 STABLE SECURITY DEFINER
 SET search_path TO ''
AS $function$
begin
  return (
    select coalesce(jsonb_agg(jsonb_build_object(
             'id', m.id, 'text', m.message->'data'->>'content',
             'asked', memchat.asked(m.message),
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
$function$;

CREATE OR REPLACE FUNCTION memchat.index_recall_keys()
 RETURNS boolean
 LANGUAGE plpgsql
 SET search_path TO ''
AS $function$
declare
  v_dimensions integer := memchat.embedding_dimensions();
  v_wanted boolean := memchat.vector_iterative_scans()
                      and v_dimensions <= memchat.hnsw_max_dimensions();
  v_half text := pg_catalog.format('extensions.halfvec(%s)', v_dimensions);
  v_table text;
  v_index text;
begin
  foreach v_table in array array['message_embeddings', 'message_facts'] loop
    v_index := v_table || '_embedding_idx';
    if pg_catalog.to_regclass('memchat.' || v_index) is not null
       and (not v_wanted
            or pg_catalog.strpos(pg_catalog.pg_get_indexdef(('memchat.' || v_index)::regclass),
                                 v_half) = 0) then
      execute pg_catalog.format('drop index memchat.%I', v_index);
    end if;
    if v_wanted then
      execute pg_catalog.format(
        'create index if not exists %I on memchat.%I'
        ' using hnsw ((embedding::%s) extensions.halfvec_cosine_ops)',
        v_index, v_table, v_half);
    end if;
  end loop;
  if not v_wanted then
    return false;
  end if;
  -- The caller's p_limit keys nearest to p_query of each kind (a message's
  -- own embedding, its fact keys), each named by its exchange, through the
  -- indexes: each scan going on
  -- until it has its rows of the caller's (hnsw.iterative_scan, set by
  -- memchat.recall), ordered in half precision, each with its distance from
  -- the stored vector. Under the caller's rights (row-level security).
  execute pg_catalog.format($f$
    create or replace function memchat.nearest_keys_indexed(
      p_uid uuid, p_agent_name text, p_model text, p_query extensions.vector, p_limit integer
    ) returns table (message_id bigint, session_id uuid, distance double precision)
    language plpgsql stable
    set search_path = ''
    set plan_cache_mode = force_generic_plan
    as $b$
    declare
      v_query %1$s := p_query::%1$s;
    begin
      return query
        (select coalesce(e.exchange_id, e.message_id), e.session_id,
                e.embedding operator(extensions.<=>) p_query
           from memchat.message_embeddings e
          where e.user_id = p_uid and e.agent_name = p_agent_name and e.model = p_model
          order by (e.embedding::%1$s) operator(extensions.<=>) v_query
          limit p_limit)
        union all
        (select f.message_id, f.session_id, f.embedding operator(extensions.<=>) p_query
           from memchat.message_facts f
          where f.user_id = p_uid and f.agent_name = p_agent_name and f.model = p_model
          order by (f.embedding::%1$s) operator(extensions.<=>) v_query
          limit p_limit);
    end
    $b$ $f$, v_half);
  revoke all on function memchat.nearest_keys_indexed(uuid, text, text, extensions.vector, integer)
    from public;
  grant execute on function
    memchat.nearest_keys_indexed(uuid, text, text, extensions.vector, integer) to memchat_user;
  return true;
end
$function$;

CREATE OR REPLACE FUNCTION memchat.index_round()
 RETURNS trigger
 LANGUAGE plpgsql
 SET search_path TO ''
AS $function$
declare
  v_message jsonb;
  v_answer text;
begin
  select h.message into v_message
    from public.chat_message_history h
   where h.id = new.message_id;
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
  v_answer := memchat.answer_of(new.message_id);
  new.exchange_id := null;
  new.lexemes := memchat.owned_lexemes(
    memchat.round_lexemes(v_message->'data'->>'content', v_answer), new.user_id);
  if memchat.says_several_things(v_message->'data'->>'content') then
    new.facts_model := null;
  else
    new.facts_model := new.model;
  end if;
  if new.facts_model is null or v_answer is not null then
    insert into memchat.embedding_queue as q (session_id, user_id)
    values (new.session_id, new.user_id)
    on conflict (session_id, user_id) do update set attempts = 0, next_attempt_at = now()
     where q.next_attempt_at = 'infinity';
  end if;
  return new;
end
$function$;

CREATE OR REPLACE FUNCTION memchat.owned_rounds_matching(p_user_id uuid, p_agent_name text, p_model text, p_words tsquery, p_owned tsquery, p_session_id uuid, p_floor bigint, p_limit integer, p_rounds bigint)
 RETURNS bigint[]
 LANGUAGE plpgsql
 STABLE
 SET search_path TO ''
 SET enable_bitmapscan TO 'on'
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
begin
  perform pg_catalog.set_config(
    'plan_cache_mode',
    case when p_rounds > memchat.words_planned_from() then 'force_custom_plan'
         else 'force_generic_plan' end,
    true);
  return (
    with matched as materialized (
      -- Each round's lexemes decompressed once (stored compressed in the
      -- row, they would be again at every test below).
      select e.message_id, e.lexemes operator(pg_catalog.||) ''::tsvector as lexemes,
             pg_catalog.length(e.lexemes) as size
        from memchat.message_embeddings e
        join public.chat_sessions s on s.id = e.session_id and s.user_id = e.user_id
       where e.user_id = p_user_id and e.agent_name = p_agent_name and e.model = p_model
         and s.status = 'active' and s.expires_at > pg_catalog.now()
         and (p_session_id is null or e.session_id <> p_session_id or e.message_id < p_floor)
         and e.lexemes operator(pg_catalog.@@) p_owned
    ), weighed as materialized (
      -- Each word of p_words (tsquery's output quotes it), its weight, and
      -- the matched rounds' mean length.
      select d.word,
             pg_catalog.ln(1 + (greatest(p_rounds, d.matched) - d.rounds + 0.5) / (d.rounds + 0.5))
               as idf,
             d.size
        from (select w.word,
                     count(*) filter (where m.lexemes operator(pg_catalog.@@) w.word) as rounds,
                     count(*) as matched, greatest(avg(m.size), 1) as size
                from (select distinct ('''' || l[1] || '''')::tsquery as word
                        from pg_catalog.regexp_matches(p_words::text, '''((?:[^'']|'''')+)''', 'g')
                             l) w
               cross join matched m
               group by w.word) d
    )
    select coalesce(array_agg(r.message_id order by r.score desc, r.message_id desc), '{}')
      from (select m.message_id,
                   sum(w.idf) * 2.2 / (1 + 1.2 * (0.6 + 0.4 * m.size / min(w.size))) as score
              from matched m
              join weighed w on m.lexemes operator(pg_catalog.@@) w.word
             group by m.message_id, m.size
             order by 2 desc, 1 desc
             limit p_limit) r);
end
$function$;

drop function if exists memchat.owned_rounds_matching(uuid,text,text,tsquery,tsquery,uuid,bigint,integer,boolean);

CREATE OR REPLACE FUNCTION memchat.recall(p_session_id uuid, p_agent_name text, p_window integer, p_query extensions.vector, p_model text, p_text text, p_k integer, p_min_score double precision, p_collapse double precision, p_from timestamp with time zone, p_until timestamp with time zone)
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
    v_meaning := array(
      select n.message_id
        from memchat.nearest_keys_indexed(v_uid, p_agent_name, p_model, p_query,
                                          v_depth + p_window) n
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
    v_meaning := array(select n.message_id from memchat.nearest_messages(
      v_uid, p_agent_name, p_model, p_session_id, v_floor, p_query, v_depth, null, null) n);
  end if;
  if p_from is not null or p_until is not null then
    v_period := array(select n.message_id from memchat.nearest_messages(
      v_uid, p_agent_name, p_model, p_session_id, v_floor, p_query, v_depth, p_from, p_until) n);
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
             'answer', left(case when memchat.asked(h.message) then ha.content
                                 else h.message->'data'->>'content' end, 2000),
             'before', case when b.id is not null then jsonb_build_object(
               'message_id', b.id,
               'question', left(b.message->'data'->>'content', 1000),
               'answer', left(ba.content, 1000)) end,
             'after', case when a.id is not null then jsonb_build_object(
               'message_id', a.id,
               'question', left(a.message->'data'->>'content', 1000),
               'answer', left(aa.content, 1000)) end)
           order by hit.ord)
      from unnest(p_ids, p_scores) with ordinality as hit(id, score, ord)
      join public.chat_message_history h on h.id = hit.id
      join public.chat_sessions s on s.id = h.session_id and s.user_id = h.user_id
      left join lateral memchat.answer_after(h.user_id, h.session_id, h.id) ha on true
      -- The exchange before it in its session (its neighbour): what the hit
      -- often answers or goes on from.
      left join lateral (
           select x.id, x.message from public.chat_message_history x
            where x.user_id = h.user_id and x.session_id = h.session_id and x.id < h.id
              and memchat.asked(x.message)
            order by x.id desc limit 1) b on true
      left join lateral memchat.answer_after(h.user_id, h.session_id, b.id) ba on true
      -- The exchange after it: what often answers or corrects it. In the
      -- turn's session, not one of the window's (the prompt shows those).
      left join lateral (
           select x.id, x.message from public.chat_message_history x
            where x.user_id = h.user_id and x.session_id = h.session_id and x.id > h.id
              and (p_session_id is null or x.session_id <> p_session_id or x.id < p_floor)
              and memchat.asked(x.message)
            order by x.id limit 1) a on true
      left join lateral memchat.answer_after(h.user_id, h.session_id, a.id) aa on true),
    '[]'::jsonb);
end
$function$;

CREATE OR REPLACE FUNCTION memchat.recall_keys(p_uid uuid, p_agent_name text, p_model text, p_session_id uuid, p_floor bigint)
 RETURNS TABLE(message_id bigint, created_at timestamp with time zone, embedding extensions.vector)
 LANGUAGE sql
 STABLE
AS $function$
  select coalesce(e.exchange_id, e.message_id), e.created_at, e.embedding
    from memchat.message_embeddings e
    join public.chat_sessions s on s.id = e.session_id and s.user_id = e.user_id
   where e.user_id = p_uid and e.agent_name = p_agent_name and e.model = p_model
     and s.status = 'active' and s.expires_at > pg_catalog.now()
     and (p_session_id is null or e.session_id <> p_session_id or e.message_id < p_floor)
  union all
  select f.message_id, f.created_at, f.embedding
    from memchat.message_facts f
    join public.chat_sessions s on s.id = f.session_id and s.user_id = f.user_id
   where f.user_id = p_uid and f.agent_name = p_agent_name and f.model = p_model
     and s.status = 'active' and s.expires_at > pg_catalog.now()
     and (p_session_id is null or f.session_id <> p_session_id or f.message_id < p_floor)
$function$;

CREATE OR REPLACE FUNCTION memchat.rounds_matching(p_agent_name text, p_model text, p_words tsquery, p_session_id uuid, p_floor bigint, p_limit integer, p_rounds bigint)
 RETURNS bigint[]
 LANGUAGE plpgsql
 STABLE SECURITY DEFINER
 SET search_path TO ''
 SET enable_nestloop TO 'off'
AS $function$
begin
  -- Without a user (claims without `sub`) both are null: no row matches.
  return memchat.owned_rounds_matching(
           auth.uid(), p_agent_name, p_model, p_words,
           pg_catalog.quote_literal(memchat.owner_lexeme(auth.uid()))::tsquery
             operator(pg_catalog.&&) p_words,
           p_session_id, p_floor, p_limit, p_rounds);
end
$function$;

select memchat.index_recall_keys();

revoke all on function memchat.asked(jsonb) from public;

grant execute on function memchat.asked(jsonb) to memchat_user;

revoke all on function memchat.owned_rounds_matching(uuid,text,text,tsquery,tsquery,uuid,bigint,integer,bigint) from public;

comment on column memchat.message_embeddings.exchange_id is 'The user message whose exchange an answer''s embedding is a key of; null: its own.';

comment on column memchat.message_embeddings.lexemes is 'The full-text lexemes of the message''s round: its text (weight A), its answer''s (B), and its owner''s lexeme (memchat.owner_lexeme), so that the GIN index finds one user''s rounds; an assistant message that opens its session: its text (B); null for an answer (its round is its question''s).';

comment on table memchat.message_embeddings is 'The embedding of each stored message with text (the user''s and the assistant''s), for recall, partitioned by user (memchat.key_partition). Goes with its message (trigger chat_message_history_dependents).';

-- The assistant's messages already stored get their embeddings from the
-- backfill: every live session holding one is queued.
insert into memchat.embedding_queue (session_id, user_id)
select s.id, s.user_id
  from public.chat_sessions s
 where s.status = 'active' and s.expires_at > now()
   and exists (select 1 from public.chat_message_history h
                where h.user_id = s.user_id and h.session_id = s.id
                  and h.message->>'type' = 'ai' and memchat.embeddable(h.message))
on conflict (session_id, user_id) do update set attempts = 0, next_attempt_at = now()
 where memchat.embedding_queue.next_attempt_at = 'infinity';
