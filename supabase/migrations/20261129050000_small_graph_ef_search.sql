-- Recall's HNSW scans walk a candidate list sized to the graph they walk
-- (issue 22).
--
-- hnsw.ef_search was 100 for every scan (migration *_recall_at_scale.sql).
-- How closely an HNSW scan follows the exact order at a given ef_search
-- falls as the graph grows, and since migration *_key_partitions.sql the
-- graph a recall walks is its caller's partition's, not the whole table's.
-- Measured on bench_recall.py's data (a throwaway probe; recall@3: the
-- exact scan's hits that memchat.recall returned, 50 queries per user;
-- docs/benchmarks.md, "A candidate list sized to the caller's partition"):
--
--   rows in the caller's partition   ef_search 100   64      48      32-40
--   6,000                            1.000           1.000   1.000   1.000
--   15,500                           1.000           1.000   1.000   0.967
--   34,000                           0.980           0.967   0.947   0.947
--   64,500                           0.953           0.933   0.933   0.907
--   103,500                          0.947           0.913   0.887   0.840
--
-- So a partition of fewer than 15,000 rows is searched with 48 candidates
-- (the same hits; for a history of 1,000 rounds alone in its partition,
-- the scan 0.45-0.47 ms instead of 0.55-0.69 and the whole recall about 5%
-- less), a larger one, or one never analysed (its size unknown), with 100
-- as before. The comment of *_recall_at_scale.sql (40 missing a planted
-- neighbour among random vectors in tests/store/test_recall_scale.py)
-- predates the partitions: that test finds every planted neighbour at 16.
--
-- memchat.recall differs from migration *_word_list_plans_everywhere.sql
-- only in the ef_search it sets.

-- PL/pgSQL, as the other helpers with arguments: a SQL function with a
-- setting is planned at every call (tests/store/test_plans.py). The
-- partition holds at least its caller's rounds, whatever its statistics
-- (made while it was smaller, e.g. 0 when its indexes were built empty) say.
create function memchat.recall_ef_search(p_partition_rows real, p_rounds bigint)
returns integer
language plpgsql immutable parallel safe
set search_path = ''
as $$
begin
  return case when p_partition_rows >= 0 and greatest(p_partition_rows, p_rounds) < 15000
              then 48 else 100 end;
end
$$;
revoke all on function memchat.recall_ef_search(real, bigint) from public;
grant execute on function memchat.recall_ef_search(real, bigint) to memchat_user;

-- As in migration *_word_list_plans_everywhere.sql, the candidate list sized
-- to the caller's partition (its rows as the statistics give them, and the
-- history's length, both read above).
create or replace function memchat.recall(
  p_session_id uuid,
  p_agent_name text,
  p_window integer,
  p_query extensions.vector,
  p_model text,
  p_text text,
  p_k integer,
  p_min_score double precision,
  p_collapse double precision,
  p_from timestamptz,
  p_until timestamptz
) returns jsonb
language plpgsql stable
set search_path = ''
set enable_bitmapscan = off
set enable_sort = on
set enable_nestloop = on
-- Generic plans: the partitions are pruned when a plan starts. A plan made
-- for each call's values prunes them while planning, but planning over the
-- partitioned tables costs more than it saves, and the plan cache, seeing a
-- generic plan's cost summed over all 32 partitions, would never switch to
-- one (LongMemEval's questions: recall 8.6-10.1 ms median instead of 6.1-6.9
-- before the partitions; 6.1-7.5 with this setting).
set plan_cache_mode = force_generic_plan
as $$
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

  -- A message is as near as its nearest key (its own embedding or a fact's).
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
    -- migration *_recall_plan.sql).
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
  -- fetched.
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
                             and k.model = p_model)) as score
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
$$;

drop function memchat.recall_ef_search();
