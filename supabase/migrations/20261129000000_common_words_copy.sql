-- Recall's word list reads a copy of the common words; its picks stop once
-- they are decided (issue 22).
--
-- Both cut what one recall costs without changing what it returns. On
-- bench_langgraph.py's data (users of 1,000 exchanges, a turn's words in
-- 90% of their rounds) a throwaway copy of memchat.recall with clock marks
-- between its steps gave, as the caller, median microseconds: the HNSW
-- scans 430-610, memchat.rarer_words 410-600, the word list itself 330-400,
-- the fusion, floor and collapse 250-300, the hits' rows 210-240
-- (docs/benchmarks.md, "The common words copied; picks that stop when
-- decided").
--
-- 1. memchat.rarer_words read the caller's partition's most common lexemes
--    from pg_stats at every call: the view's row, its 1,000 lexemes turned
--    from anyarray into text[] and joined to the message's words, about
--    0.4 ms of a 2.3 ms recall. The statistics change only when the
--    partition is analysed, so they are copied into two tables, one row
--    per partition (memchat.word_statistics: when it was analysed, the
--    listed shares' floor) and one per common lexeme (memchat.common_words),
--    read by primary key for the message's few words. The copy is made by
--    memchat.copy_word_statistics(), which memchat.embedding_statistics()
--    calls at the end of every backfill run (the summary function's
--    schedule, 5 minutes by default), after analysing the young partitions,
--    and this migration once. A copy is used only while it is the
--    partition's latest: its analysed_at no older than the partition's last
--    analysis (pg_stat_get_last_analyze_time, ..._autoanalyze_time). After
--    autovacuum analyses a partition, recall reads pg_stats as before
--    until the next run copies it: never older statistics, at worst the old
--    cost for a few minutes.
--
--    The tables hold what pg_statistic holds (the lexemes common in a
--    partition, many users' words): no role but the owner reads them; RLS
--    is on with no policy, and memchat.rarer_words (security definer, as
--    before) reads them for the caller's partition only.
--
-- 2. memchat.recall built the whole pool of candidates (every one of up to
--    three lists' 20, each with its similarity to the query and a look at
--    its fact keys, each compared with the pool's kept embeddings for the
--    collapse) and then picked the k best. A pick cannot change once the
--    pool's best value (its fused score, 0.9 times less per hit already
--    taken from its session) is at least the next candidate's fused score:
--    a candidate's value is never above its fused score, and the candidates
--    come in fused order. The candidates are now read through a cursor, the
--    similarity and the fact keys computed per row as it is fetched, and
--    the picks are taken as soon as they are decided: k picks typically
--    need the first few candidates of 20-40. The same hits in the same
--    order (the decision rule is the old loop's, ties included: an earlier
--    candidate wins a tie, as it did).
--
-- memchat.recall differs from migration *_recall_hits.sql only in the
-- fusion's loop; memchat.rarer_words from migration *_plain_words.sql only
-- in where it reads the common lexemes.

create table memchat.word_statistics (
  partition_name text primary key,
  analysed_at timestamptz not null,
  -- The least share most_common_elem_freqs lists: a lexeme not listed is
  -- at most this common.
  floor real not null
);
comment on table memchat.word_statistics is
  'The copy of a recall-key partition''s lexeme statistics (memchat.copy_word_statistics); see migration *_common_words_copy.sql.';

create table memchat.common_words (
  partition_name text not null references memchat.word_statistics on delete cascade,
  lexeme text not null,
  share real not null,
  primary key (partition_name, lexeme)
);
comment on table memchat.common_words is
  'A recall-key partition''s most common lexemes with their shares of its rows, copied from pg_stats; see migration *_common_words_copy.sql.';

alter table memchat.word_statistics enable row level security;
alter table memchat.common_words enable row level security;
-- Supabase's default privileges may grant new tables to its API roles.
revoke all on memchat.word_statistics, memchat.common_words
  from public, anon, authenticated, service_role;

-- The partition's last analysis as the cumulative statistics know it
-- (-infinity: none known, e.g. after they were reset).
create function memchat.last_analysed(p_partition pg_catalog.regclass) returns timestamptz
language sql stable
set search_path = ''
as $$
  select coalesce(greatest(pg_catalog.pg_stat_get_last_analyze_time(p_partition),
                           pg_catalog.pg_stat_get_last_autoanalyze_time(p_partition)),
                  '-infinity')
$$;
revoke all on function memchat.last_analysed(pg_catalog.regclass) from public;

-- Copy the statistics of every recall-key partition analysed since its
-- copy (or never copied). The analysis time is read before the statistics:
-- an analysis that lands in between leaves the copy older than the
-- partition's last analysis, so it is not used, and the next run copies
-- again. Returns how many partitions were copied.
create function memchat.copy_word_statistics() returns integer
language plpgsql
security definer
set search_path = ''
as $$
declare
  v_part record;
  v_at timestamptz;
  v_elems text[];
  v_shares real[];
  v_copied integer := 0;
begin
  for v_part in
    select i.inhrelid::pg_catalog.regclass as oid, c.relname::text as name, w.analysed_at
      from pg_catalog.pg_inherits i
      join pg_catalog.pg_class c on c.oid = i.inhrelid
      left join memchat.word_statistics w on w.partition_name = c.relname::text
     where i.inhparent = 'memchat.message_embeddings'::pg_catalog.regclass
     order by 2
  loop
    v_at := memchat.last_analysed(v_part.oid);
    -- Copied since its last analysis, or never analysed that we know of.
    continue when v_part.analysed_at >= v_at
               or (v_part.analysed_at is null and v_at = '-infinity');
    select s.most_common_elems::text::text[], s.most_common_elem_freqs
      into v_elems, v_shares
      from pg_catalog.pg_stats s
     where s.schemaname = 'memchat' and s.tablename = v_part.name and s.attname = 'lexemes';
    delete from memchat.word_statistics w where w.partition_name = v_part.name;
    if v_elems is not null then
      v_copied := v_copied + 1;
      -- most_common_elem_freqs ends with the least and greatest listed
      -- share and the share of nulls.
      insert into memchat.word_statistics (partition_name, analysed_at, floor)
      values (v_part.name, v_at, v_shares[cardinality(v_elems) + 1]);
      insert into memchat.common_words (partition_name, lexeme, share)
      select v_part.name, e.lexeme, e.share
        from unnest(v_elems, v_shares[1:cardinality(v_elems)]) e(lexeme, share);
    end if;
  end loop;
  return v_copied;
end
$$;
revoke all on function memchat.copy_word_statistics() from public;

select memchat.copy_word_statistics();

-- As in migration *_young_partition_sweep.sql, and then the copies.
create or replace function memchat.embedding_statistics() returns integer
language plpgsql
security definer
set search_path = ''
as $$
declare
  v_keys pg_catalog.regclass;
  v_counted real;
  v_enough bigint;
  v_present bigint;
  v_analysed integer := 0;
begin
  for v_keys in
    select i.inhrelid::pg_catalog.regclass
      from pg_catalog.pg_inherits i
     where i.inhparent = 'memchat.message_embeddings'::pg_catalog.regclass
     order by 1
  loop
    -- -1: never analysed (nor vacuumed).
    select c.reltuples into v_counted from pg_catalog.pg_class c where c.oid = v_keys;
    continue when v_counted >= 5000;
    v_enough := greatest(2 * v_counted, 1000)::bigint;
    execute pg_catalog.format('select count(*) from (select from %s limit $1) k', v_keys)
       into v_present using v_enough;
    continue when v_present < v_enough;
    execute pg_catalog.format('analyze %s', v_keys);
    -- Its sibling: memchat.message_facts_pNN for memchat.message_embeddings_pNN.
    v_keys := pg_catalog.to_regclass(
      pg_catalog.replace(v_keys::text, 'memchat.message_embeddings_', 'memchat.message_facts_'));
    if v_keys is not null then
      execute pg_catalog.format('analyze %s', v_keys);
    end if;
    v_analysed := v_analysed + 1;
  end loop;
  -- What this run analysed, and what autovacuum did since the last run.
  perform memchat.copy_word_statistics();
  return v_analysed;
end
$$;

create or replace function memchat.rarer_words(p_words tsquery, p_rounds bigint, p_budget integer)
returns tsquery
language plpgsql stable security definer
set search_path = ''
as $$
declare
  v_name text := memchat.key_partition_name('message_embeddings', auth.uid());
  v_lexemes text[];
  v_shares real[];
  v_elems text[];
  v_listed real[];
  v_floor real;
  v_kept text[] := '{}';
  v_expected double precision := 0;
  v_lexeme record;
begin
  if p_words is null or p_rounds <= greatest(p_budget, memchat.words_whole_rounds()) then
    return p_words;
  end if;
  -- Each lexeme as the statistics spell it (tsquery's input doubles quotes).
  v_lexemes := array(select distinct l[1] from pg_catalog.regexp_matches(p_words::text, '''((?:[^'']|'''')+)''', 'g') l);
  select w.floor into v_floor
    from memchat.word_statistics w
   where w.partition_name = v_name
     and w.analysed_at >= memchat.last_analysed(pg_catalog.to_regclass('memchat.' || v_name));
  if found then
    -- The copy is the partition's latest statistics: its lexemes by key.
    v_shares := array(
      select coalesce(c.share, v_floor)
        from unnest(v_lexemes) with ordinality q(lexeme, n)
        left join memchat.common_words c
          on c.partition_name = v_name and c.lexeme = replace(q.lexeme, '''''', '''')
       order by q.n);
  else
    select s.most_common_elems::text::text[], s.most_common_elem_freqs
      into v_elems, v_listed
      from pg_catalog.pg_stats s
     where s.schemaname = 'memchat'
       and s.tablename = v_name
       and s.attname = 'lexemes';
    if v_elems is null then
      return p_words;  -- not analysed yet: every word
    end if;
    -- most_common_elem_freqs ends with the least and greatest listed share
    -- and the share of nulls.
    v_floor := v_listed[cardinality(v_elems) + 1];
    v_shares := array(
      select coalesce(f.share, v_floor)
        from unnest(v_lexemes) with ordinality q(lexeme, n)
        left join unnest(v_elems, v_listed[1:cardinality(v_elems)]) f(lexeme, share)
          on f.lexeme = replace(q.lexeme, '''''', '''')
       order by q.n);
  end if;
  for v_lexeme in
    select q.lexeme, q.share from unnest(v_lexemes, v_shares) q(lexeme, share) order by 2, 1
  loop
    exit when cardinality(v_kept) > 0 and v_expected + v_lexeme.share * p_rounds > p_budget;
    v_kept := v_kept || v_lexeme.lexeme;
    v_expected := v_expected + v_lexeme.share * p_rounds;
  end loop;
  if v_expected > 10 * p_budget then
    return null;  -- only the rarest word is kept, and it is common: no words
  end if;
  if cardinality(v_kept) = cardinality(v_lexemes) then
    return p_words;
  end if;
  return (select string_agg('''' || k || '''', ' | ') from unnest(v_kept) k)::tsquery;
end
$$;


-- As in migration *_recall_hits.sql, the candidates through a cursor and
-- each pick taken once decided.
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
            set_config('hnsw.ef_search', memchat.recall_ef_search()::text, true),
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
                                          v_depth);
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

