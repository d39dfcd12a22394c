-- Recall at scale (issue 22): what one recall reads stops growing with the
-- caller's history.
--
-- * By meaning: where pgvector has iterative index scans (0.8 and later, as
--   on Supabase), HNSW indexes over the messages' embeddings and the fact
--   keys (memchat.index_recall_keys), and a caller with a long history
--   (memchat.ann_from_messages() messages or more in live sessions, and a
--   share of the table large enough, below) is searched through them: the
--   nearest keys of the caller's own, found by the index scan that keeps
--   going until it has them (hnsw.iterative_scan), then filtered to live
--   sessions outside the window. A scan filtered to one caller's rows
--   visits about (rows wanted) / (the caller's share of the table) entries,
--   each a read of its row as the exact scan's are: the index is taken when
--   that is well under the caller's own rows (docs/benchmarks.md). If that
--   yields fewer than k (many of the nearest in expired sessions, or the
--   scans' tuple limit reached for a caller with a small share of a huge
--   table), the exact scan runs instead. A shorter history, or an older
--   pgvector (0.6 in pgserver 0.1.4, no iterative scans: a filtered HNSW
--   search returns fewer rows than exist), is ranked exactly, as before:
--   for those the exact scan is cheap, or the only correct one.
-- * By words, through the GIN index: the rounds holding the query's words
--   are found by memchat.rounds_matching, which filters to the caller's rows
--   itself (auth.uid()), as the owner. Under row-level security the planner
--   may not use the GIN index for `@@` (ts_match_vq is not leakproof, so it
--   cannot run before the policy's filter): every one of the caller's rows
--   was read and tested, 10,000 heap pages for a caller of 10,000 messages,
--   where the index finds the 200 that hold a word.
-- * By words: a caller with more rounds than memchat.words_budget() searches
--   with the query's rarer words only: its commonest words, by the table's
--   own statistics (pg_stats' most common elements of the lexemes), are
--   left out until the rounds expected to hold one of the rest fit the
--   budget. A common word's matches are many and say little (what BM25's
--   inverse document frequency says too); ranking them all cost 30 ms at
--   10,000 messages and 750 ms at 100,000 (docs/benchmarks.md). Shorter
--   histories keep every word.

-- ======================================================= pgvector's abilities
-- Whether the installed pgvector has iterative index scans (0.8.0+).
create function memchat.vector_iterative_scans() returns boolean
language sql stable parallel safe
set search_path = ''
as $$
  select coalesce((
    select pg_catalog.string_to_array(pg_catalog.split_part(e.extversion, '-', 1), '.')::int[]
           >= array[0, 8]
      from pg_catalog.pg_extension e
     where e.extname = 'vector'), false)
$$;

-- From how many messages in live sessions (user and assistant: the
-- sessions' message_count) a caller's nearest keys come from the HNSW
-- indexes. Below it the exact scan is cheap (about 1,000 keys) and exact; a
-- caller with few rows in a big table is also where a filtered index scan
-- works hardest for what it finds.
create function memchat.ann_from_messages() returns integer
language sql immutable parallel safe
set search_path = ''
as $$ select 2000 $$;

-- The HNSW scans' candidate list (hnsw.ef_search): how closely they follow
-- the exact order (pgvector's default, 40, missed a planted 0.8 neighbour
-- among random vectors in tests/store/test_recall_scale.py).
create function memchat.recall_ef_search() returns integer
language sql immutable parallel safe
set search_path = ''
as $$ select 100 $$;

-- How many rounds the words list may expect to rank. (On LongMemEval, whose
-- users have about 490 rounds, ranking with the rarer words within 300
-- found what all of them found: docs/benchmarks.md.)
create function memchat.words_budget() returns integer
language sql immutable parallel safe
set search_path = ''
as $$ select 300 $$;

-- The HNSW indexes over the recall keys: made where iterative scans exist
-- and the vectors are short enough for HNSW (2,000 dimensions), dropped
-- otherwise. Run by the migrations and after a change of the column's size
-- (memchat.store.resize_embeddings, as the owner), which drops them first.
create function memchat.index_recall_keys() returns boolean
language plpgsql
set search_path = ''
as $$
declare
  v_wanted boolean := memchat.vector_iterative_scans() and memchat.embedding_dimensions() <= 2000;
begin
  if v_wanted then
    create index if not exists message_embeddings_embedding_idx
      on memchat.message_embeddings using hnsw (embedding extensions.vector_cosine_ops);
    create index if not exists message_facts_embedding_idx
      on memchat.message_facts using hnsw (embedding extensions.vector_cosine_ops);
  else
    drop index if exists memchat.message_embeddings_embedding_idx;
    drop index if exists memchat.message_facts_embedding_idx;
  end if;
  return v_wanted;
end
$$;
revoke all on function memchat.index_recall_keys() from public;

select memchat.index_recall_keys();

-- Whether recall may search the HNSW indexes: iterative scans, and both
-- indexes there.
create function memchat.recall_index_ready() returns boolean
language sql stable
set search_path = ''
as $$
  select memchat.vector_iterative_scans()
     and pg_catalog.to_regclass('memchat.message_embeddings_embedding_idx') is not null
     and pg_catalog.to_regclass('memchat.message_facts_embedding_idx') is not null
$$;

-- ======================================================= the rarer words
-- `p_words` without its commonest lexemes, for a caller with `p_rounds`
-- rounds: while the rounds expected to hold one of its lexemes (each
-- lexeme's share of all rows, from pg_stats, times p_rounds; a lexeme the
-- statistics do not list counts at the least listed share) exceed
-- p_budget, the commonest goes; the rarest always stays. Phrases and
-- exclusions of websearch syntax are not kept: such a query is left whole.
-- SECURITY DEFINER: pg_stats shows a table under row-level security only to
-- its owner; what leaves it is which of the caller's own words are common.
create function memchat.rarer_words(p_words tsquery, p_rounds bigint, p_budget integer)
returns tsquery
language plpgsql stable security definer
set search_path = ''
as $$
declare
  v_lexemes text[];
  v_elems text[];
  v_freqs real[];
  v_floor real;
  v_kept text[] := '{}';
  v_expected double precision := 0;
  v_lexeme record;
begin
  if p_words is null or p_rounds <= p_budget or p_words::text ~ '[!<]' then
    return p_words;
  end if;
  select s.most_common_elems::text::text[], s.most_common_elem_freqs
    into v_elems, v_freqs
    from pg_catalog.pg_stats s
   where s.schemaname = 'memchat' and s.tablename = 'message_embeddings'
     and s.attname = 'lexemes';
  if v_elems is null then
    return p_words;  -- not analysed yet: every word
  end if;
  -- most_common_elem_freqs ends with the least and greatest listed share
  -- and the share of nulls.
  v_floor := v_freqs[cardinality(v_elems) + 1];
  v_lexemes := array(select distinct l[1] from pg_catalog.regexp_matches(p_words::text, '''((?:[^'']|'''')+)''', 'g') l);
  for v_lexeme in
    select q.lexeme, coalesce(f.freq, v_floor) as freq
      from unnest(v_lexemes) q(lexeme)
      left join unnest(v_elems, v_freqs[1:cardinality(v_elems)]) f(elem, freq)
        on f.elem = replace(q.lexeme, '''''', '''')
     order by 2, 1
  loop
    exit when cardinality(v_kept) > 0 and v_expected + v_lexeme.freq * p_rounds > p_budget;
    v_kept := v_kept || v_lexeme.lexeme;
    v_expected := v_expected + v_lexeme.freq * p_rounds;
  end loop;
  if cardinality(v_kept) = cardinality(v_lexemes) then
    return p_words;
  end if;
  return (select string_agg('''' || k || '''', ' | ') from unnest(v_kept) k)::tsquery;
end
$$;
revoke all on function memchat.rarer_words(tsquery, bigint, integer) from public;

-- The caller's rounds of one agent and model in live sessions, outside the
-- window (as memchat.recall_keys), holding a word of p_words: their message
-- ids, best first by ts_rank (normalised by the round's length: 1 + log; a
-- word in the message (weight A) counts more than one in its answer (B)).
-- SECURITY DEFINER so that the GIN index can be used (above); the caller's
-- rows only, by the verified claims' auth.uid() (none without claims).
create function memchat.rounds_matching(
  p_agent_name text, p_model text, p_words tsquery, p_session_id uuid, p_floor bigint,
  p_limit integer
) returns bigint[]
language sql stable security definer
set search_path = ''
set enable_bitmapscan = on
as $$
  select coalesce(array_agg(m.message_id order by m.rank desc, m.message_id desc), '{}')
    from (select e.message_id, ts_rank(e.lexemes, p_words, 1) as rank
            from memchat.message_embeddings e
            join public.chat_sessions s on s.id = e.session_id and s.user_id = e.user_id
           where e.user_id = auth.uid() and e.agent_name = p_agent_name and e.model = p_model
             and s.status = 'active' and s.expires_at > pg_catalog.now()
             and (p_session_id is null or e.session_id <> p_session_id or e.message_id < p_floor)
             and e.lexemes operator(pg_catalog.@@) p_words
           order by 2 desc, 1 desc
           limit p_limit) m
$$;
revoke all on function memchat.rounds_matching(text, text, tsquery, uuid, bigint, integer)
  from public;

-- The exact scan: the caller's p_depth messages nearest to p_query (a
-- message as near as its nearest key, memchat.recall_keys), written in
-- [p_from, p_until) (null: open), best first. Plain SQL, inlined into
-- memchat.recall's statements with its caller's rights; the owner indexes
-- read in order (bitmap scans off there, migration *_recall_plan.sql).
create function memchat.nearest_messages(
  p_uid uuid, p_agent_name text, p_model text, p_session_id uuid, p_floor bigint,
  p_query extensions.vector, p_depth integer, p_from timestamptz, p_until timestamptz
) returns table (message_id bigint)
language sql stable
as $$
  select k.message_id
    from (select k.message_id, k.embedding operator(extensions.<=>) p_query as distance
            from memchat.recall_keys(p_uid, p_agent_name, p_model, p_session_id, p_floor) k
           where k.created_at >= coalesce(p_from, '-infinity')
             and k.created_at < coalesce(p_until, 'infinity')
           order by distance
           limit p_depth * 3) k
   group by k.message_id
   order by min(k.distance), k.message_id desc
   limit p_depth
$$;
revoke all on function memchat.nearest_messages(uuid, text, text, uuid, bigint, extensions.vector,
                                                integer, timestamptz, timestamptz) from public;

-- ======================================================= recall
-- As in migration *_hybrid_recall.sql, with the two lists above read as a
-- long history needs them.
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
    -- The table's rows as the statistics know them (-1: never analysed).
    select c.reltuples into v_table_rows
      from pg_catalog.pg_class c where c.oid = 'memchat.message_embeddings'::pg_catalog.regclass;
  end if;
  if v_table_rows is not null
     and (v_table_rows < 0
          or (v_messages / 2.0) ^ 2 > 4.0 * (v_depth * 3 + p_window) * v_table_rows) then
    -- The HNSW indexes, each scan going on until it has its rows of the
    -- caller's (relaxed order: re-sorted here). Sorting is off while this
    -- statement is planned, so that the planner cannot read the owner
    -- index and sort instead, which is the exact scan's cost.
    perform set_config('hnsw.iterative_scan', 'relaxed_order', true),
            set_config('hnsw.ef_search', memchat.recall_ef_search()::text, true),
            set_config('enable_sort', 'off', true),
            set_config('enable_seqscan', 'off', true);
    v_meaning := array(
      select n.message_id
        from ((select e.message_id, e.session_id,
                      e.embedding operator(extensions.<=>) p_query as distance
                 from memchat.message_embeddings e
                where e.user_id = v_uid and e.agent_name = p_agent_name and e.model = p_model
                order by e.embedding operator(extensions.<=>) p_query
                limit v_depth + p_window)
              union all
              (select f.message_id, f.session_id,
                      f.embedding operator(extensions.<=>) p_query as distance
                 from memchat.message_facts f
                where f.user_id = v_uid and f.agent_name = p_agent_name and f.model = p_model
                order by f.embedding operator(extensions.<=>) p_query
                limit v_depth + p_window)) n
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
  if v_words is not null then
    v_words := memchat.rarer_words(v_words, v_messages / 2, memchat.words_budget());
    v_matching := memchat.rounds_matching(p_agent_name, p_model, v_words, p_session_id, v_floor,
                                          v_depth);
  end if;

  -- Reciprocal rank fusion with k = 20: the lists' first places weigh more
  -- than with the customary 60, so that an exchange first by meaning and
  -- first in the period is not outranked by one that is middling in all
  -- three lists (measured on LongMemEval, docs/benchmarks.md).
  for v_candidate in
    with fused as (
      select l.id, sum(1.0 / (20 + l.r)) as fused
        from (select * from unnest(v_meaning) with ordinality as a(id, r)
              union all select * from unnest(v_matching) with ordinality as b(id, r)
              union all select * from unnest(v_period) with ordinality as c(id, r)) l
       group by l.id
    )
    select f.id as message_id, e.session_id, e.embedding, f.fused,
           1 - least(e.embedding operator(extensions.<=>) p_query,
                     (select min(x.embedding operator(extensions.<=>) p_query)
                        from memchat.message_facts x
                       where x.message_id = f.id and x.model = p_model)) as score
      from fused f
      join memchat.message_embeddings e on e.message_id = f.id
     order by f.fused desc, f.id desc
  loop
    continue when v_candidate.score < p_min_score;
    continue when exists (
      select 1 from unnest(v_kept) k(v)
       where 1 - (k.v operator(extensions.<=>) v_candidate.embedding) >= p_collapse);
    v_kept := v_kept || v_candidate.embedding;
    v_pool_ids := v_pool_ids || v_candidate.message_id;
    v_pool_fused := v_pool_fused || v_candidate.fused::double precision;
    v_pool_scores := v_pool_scores || v_candidate.score;
    v_pool_sessions := v_pool_sessions || v_candidate.session_id;
  end loop;
  -- The k best, each candidate's fused score worth 0.9 times less for every
  -- hit already taken from its session: several sessions that each say
  -- something come before one session saying it again (a question about
  -- "how many", "which first" needs them all), while a session holding
  -- several good exchanges still gives them.
  while cardinality(v_ids) < p_k loop
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
    exit when v_best is null;
    v_ids := v_ids || v_pool_ids[v_best];
    v_scores := v_scores || v_pool_scores[v_best];
    v_sessions := v_sessions || v_pool_sessions[v_best];
  end loop;

  return coalesce((
    select jsonb_agg(jsonb_build_object(
             'message_id', h.id,
             'session_id', h.session_id,
             'created_at', h.created_at,
             'score', hit.score,
             'title', s.title,
             'question', left(h.message->'data'->>'content', 2000),
             'answer', left(memchat.answer_of(h.id), 2000),
             'before', case when b.id is not null then jsonb_build_object(
               'message_id', b.id,
               'question', left(b.message->'data'->>'content', 1000),
               'answer', left(memchat.answer_of(b.id), 1000)) end)
           order by hit.ord)
      from unnest(v_ids, v_scores) with ordinality as hit(id, score, ord)
      join public.chat_message_history h on h.id = hit.id
      join public.chat_sessions s on s.id = h.session_id and s.user_id = h.user_id
      -- The exchange before it in its session (its neighbour): what the hit
      -- often answers or goes on from.
      left join lateral (
           select x.id, x.message from public.chat_message_history x
            where x.user_id = h.user_id and x.session_id = h.session_id and x.id < h.id
              and memchat.embeddable(x.message)
            order by x.id desc limit 1) b on true), '[]'::jsonb);
end
$$;

revoke all on function memchat.vector_iterative_scans(), memchat.ann_from_messages(),
  memchat.recall_ef_search(), memchat.words_budget(), memchat.recall_index_ready()
  from public;
grant execute on function memchat.vector_iterative_scans(), memchat.ann_from_messages(),
  memchat.recall_ef_search(),
  memchat.words_budget(), memchat.recall_index_ready(),
  memchat.rarer_words(tsquery, bigint, integer),
  memchat.rounds_matching(text, text, tsquery, uuid, bigint, integer),
  memchat.nearest_messages(uuid, text, text, uuid, bigint, extensions.vector, integer,
                           timestamptz, timestamptz)
  to memchat_user;
