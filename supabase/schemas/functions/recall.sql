-- Recall across conversations: a new message's embedding (and its words)
-- find the caller's earlier exchanges, under row-level security. The keys
-- it searches: tables/recall_keys.sql; the word list: functions/words.sql.
--
-- None of these functions is plain SQL that reads a table: Citus cannot
-- plan a statement into which the planner inlines such a function ("SQL
-- functions referencing distributed tables", docs/deploy.md), so every
-- statement that reads a table is written out where it runs, or is a
-- PL/pgSQL function's, called in an expression or from the FROM of a
-- statement that reads no table itself (tests/store/test_plans.py).
-- PL/pgSQL's statements are planned once per connection on every
-- PostgreSQL version.

-- ------------------------------------------------------- the keys

-- The exact scan: the ids of the caller's p_depth messages nearest to
-- p_query, best first, among their recall keys of one agent and model in
-- live sessions outside the window (message ids from p_floor on, in
-- p_session_id), written in [p_from, p_until) (null: open). The keys are
-- each message's embedding and its fact keys, each named by its exchange
-- (an answer's key is its question's): a message is as near as its nearest
-- key. The owner indexes are read in order (bitmap scans off, nested loops
-- off: memchat.recall's settings). Under the caller's rights; every table
-- read by p_uid (on Citus, its shard).
create function memchat.nearest_message_ids(
  p_uid uuid, p_agent_name text, p_model text, p_session_id uuid, p_floor bigint,
  p_query extensions.vector, p_depth integer, p_from timestamptz, p_until timestamptz
) returns bigint[]
language plpgsql stable
set search_path = ''
as $$
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
$$;

-- Whether the installed pgvector has iterative index scans (0.8.0+).
-- Without them (0.6 in pgserver 0.1.4) a filtered HNSW search returns fewer
-- rows than exist: only the exact scan is correct.
create function memchat.vector_iterative_scans() returns boolean
language plpgsql stable parallel safe
set search_path = ''
as $$
begin
  return coalesce((
    select pg_catalog.string_to_array(pg_catalog.split_part(e.extversion, '-', 1), '.')::int[]
           >= array[0, 8]
      from pg_catalog.pg_extension e
     where e.extname = 'vector'), false);
end
$$;

-- The most dimensions halfvec's HNSW indexes take (pgvector 0.7+; vector's
-- take 2,000): a 3,072-dimension model (text-embedding-3-large) has the
-- index path too.
create function memchat.hnsw_max_dimensions() returns integer
language sql immutable parallel safe
set search_path = ''
as $$ select 4000 $$;

-- From how many messages in live sessions (user and assistant: the
-- sessions' message_count) a caller's nearest keys come from the HNSW
-- indexes. Below it the exact scan is cheap (about 1,000 keys) and exact; a
-- caller with few rows in a big table is also where a filtered index scan
-- works hardest for what it finds.
create function memchat.ann_from_messages() returns integer
language sql immutable parallel safe
set search_path = ''
as $$ select 2000 $$;

-- The HNSW scans' candidate list (hnsw.ef_search), sized to the graph they
-- walk, the caller's partition's: how closely an HNSW scan follows the
-- exact order at a given ef_search falls as the graph grows. A partition of
-- fewer than 15,000 rows is searched with 48 candidates (the same hits as
-- with more), a larger one, or one never analysed (its size unknown), with
-- 100 (docs/benchmarks.md). The partition holds at least its caller's
-- rounds, whatever its statistics (made while it was smaller, e.g. 0 when
-- its indexes were built empty) say.
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

-- The HNSW indexes over the recall keys, where pgvector has iterative scans
-- and the column's size allows, and the statement that reads them
-- (memchat.nearest_keys_indexed), written for that size; otherwise no
-- indexes (the exact scan). Returns whether the indexes are there.
-- * The indexes hold the keys cast to halfvec, 2 bytes a dimension: half
--   the size, so that twice as much of them stays in shared_buffers
--   (docs/benchmarks.md). Only the order of the scan is in half precision:
--   each key's distance is computed from its stored vector, and the
--   candidates are ranked by that.
-- * An index over an expression is used by a query naming the same
--   expression, and a halfvec's size is part of it: hence
--   memchat.nearest_keys_indexed is written here (EXECUTE) for the column's
--   size, and an index of another size or kind is made again.
-- Run below, and after a change of the column's size (`memchat db reembed
-- --dimensions`: store.resize_embeddings, as the owner), which drops the
-- indexes first. memchat.nearest_keys_indexed: the caller's p_limit keys
-- nearest to p_query of each kind (a message's own embedding, its fact
-- keys), through the indexes, each scan going on until it has its rows of
-- the caller's (hnsw.iterative_scan, set by memchat.recall), ordered in half
-- precision, each with its distance from the stored vector; under the
-- caller's rights (row-level security), its plans generic (the partitions
-- pruned when a plan starts).
create function memchat.index_recall_keys() returns boolean
language plpgsql
set search_path = ''
as $$
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
$$;

-- The index path is there: iterative scans, both indexes, and the statement
-- reading them.
create function memchat.recall_index_ready() returns boolean
language plpgsql stable
set search_path = ''
as $$
begin
  return memchat.vector_iterative_scans()
     and pg_catalog.to_regclass('memchat.message_embeddings_embedding_idx') is not null
     and pg_catalog.to_regclass('memchat.message_facts_embedding_idx') is not null
     and pg_catalog.to_regprocedure(
           'memchat.nearest_keys_indexed(uuid, text, text, extensions.vector, integer)') is not null;
end
$$;

-- ------------------------------------------------------- the hits

-- The answers to p_message_id: the assistant's messages with text after it
-- in its session (memchat.embeddable: not tool calls) up to the next user
-- message (memchat.asked), joined by blank lines; no row when nothing
-- answered it. Read by a user message's recall keys (memchat.index_round)
-- in a statement of its own; memchat.recall_hits reads every hit's answers
-- in its one statement. Under the caller's rights; every read by
-- p_user_id (on Citus, its shard).
create function memchat.answer_after(p_user_id uuid, p_session_id uuid, p_message_id bigint)
returns table (content text)
language plpgsql stable
set search_path = ''
as $$
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
$$;

-- The same as a value, by the message's id alone (the migrations' backfills).
create function memchat.answer_of(p_message_id bigint) returns text
language plpgsql stable
set search_path = ''
as $$
begin
  return (
    select a.content
      from public.chat_message_history h
      cross join lateral memchat.answer_after(h.user_id, h.session_id, h.id) a
     where h.id = p_message_id);
end
$$;

-- What the caller reads of recall's hits, from the ids (and scores) it
-- chose, best first: [{message_id, session_id, created_at, score, title,
-- question, answer, before, after}]; a hit that is an assistant message no
-- user message came before (it opens its session) has question ''. `before` is the exchange before the
-- hit in its session (what the hit often answers or goes on from), `after`
-- the exchange after it (what often answers or corrects it: "actually, it
-- was Tuesday"), each cut to 1,000 characters; in the turn's session
-- (p_session_id, its window from message p_floor on) the exchange after a
-- hit is never one of the window's, which the prompt shows already. Runs as
-- the caller (under RLS): for ids that are not the caller's it returns
-- nothing. A function of its own, so that a change to what a hit carries
-- replaces it alone, not the ranking. Each of its reads is a few index
-- entries of the caller's, made once per hit: sequential scans are off,
-- which a table's statistics otherwise choose where the caller holds most
-- of its rows (a small table, or a Citus shard of few users), each lookup
-- then reading the whole table; and sorts are, so that a neighbour is the
-- first of an index read in order, not the best of every message of the
-- caller's sorted (what a plan made for the call's values, as on Citus,
-- otherwise chooses once the caller has many).
create function memchat.recall_hits(
  p_ids bigint[],
  p_scores double precision[],
  p_session_id uuid,
  p_floor bigint
) returns jsonb
language plpgsql stable
set search_path = ''
set enable_seqscan = off
set enable_sort = off
as $$
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
      -- message, as memchat.answer_after reads them. The next question is
      -- a value of the join, so that the answers are one range of the
      -- window index (user_id, session_id, id) between the two questions;
      -- the range is read under the window index's own condition (offset 0),
      -- so that no index over every answer of the user's (the digests')
      -- is read instead, whatever the statistics say.
      cross join lateral (
           select array_agg(y.content order by q.n) as of
             from unnest(array[h.id, b.id, a.id]) with ordinality q(id, n)
             -- The next question after it in its session (none: its end).
             left join lateral (
                  select coalesce((select n.id from public.chat_message_history n
                                    where n.user_id = v_uid and n.session_id = h.session_id
                                      and n.id > q.id and memchat.asked(n.message)
                                    order by n.id
                                    limit 1), 9223372036854775807) as id) nx on true
             left join lateral (
                  select pg_catalog.string_agg(x.message->'data'->>'content', E'\n\n'
                                               order by x.id) as content
                    from (select x.id, x.message
                            from public.chat_message_history x
                           where x.user_id = v_uid and x.session_id = h.session_id
                             and x.id > q.id and x.id < nx.id
                             and x.message->>'type' <> 'tool'
                             and coalesce(jsonb_array_length(x.message->'data'->'tool_calls'), 0) = 0
                          offset 0) x
                   where x.message->>'type' = 'ai' and memchat.embeddable(x.message)
                  having pg_catalog.count(*) > 0) y on true) answers
     where h.user_id = v_uid),
    '[]'::jsonb);
end
$$;

-- ------------------------------------------------------- recall

-- The caller's earlier exchanges of one agent and model (p_model: the
-- query's embedding model; those of another are never compared), by what
-- either side said, most like the turn's message (p_query, its embedding; p_text, its text), at most
-- p_k, best first, as memchat.recall_hits gives them: in live sessions only
-- (not expired; cleared ones have no messages left), never the last
-- p_window conversational messages of p_session_id (the turn's session;
-- null: the active one, if any), none below p_min_score (the similarity to
-- the nearest of the message's keys, however it was found: an operator's
-- floor holds), and none at p_collapse similarity or more to a better hit
-- (near-duplicates collapse into the best one). Runs as the caller: RLS
-- applies to every read.
--
-- Three candidate lists, each its own statement, fused by reciprocal rank:
-- * by meaning, the nearest keys: a long history (memchat.ann_from_messages()
--   messages or more, and a share of its partition large enough that a
--   filtered scan visits well under the caller's own rows) through the
--   HNSW indexes of the caller's partition (memchat.nearest_keys_indexed),
--   each scan going on until it has its rows of the caller's; if that yields
--   fewer than k (many of the nearest in expired sessions, or the scans'
--   tuple limit reached), or for a shorter history, or without iterative
--   scans, the exact scan (memchat.nearest_message_ids), the owner index read
--   in order;
-- * by words (memchat.rounds_matching, with memchat.rarer_words' words);
-- * when a period [p_from, p_until) is given (a time expression in the
--   message, read by the API), the nearest by meaning within it.
-- The k best are then picked, each candidate's fused score worth 0.9 times
-- less for every hit already taken from its session: several sessions that
-- each say something come before one session saying it again (a question
-- about "how many", "which first" needs them all). The candidates are read
-- through a cursor, best fused first, each one's similarity computed as it
-- is fetched, and a pick is taken as soon as no later candidate can change
-- it.
--
-- Its settings:
-- * enable_bitmapscan = off: an ordered scan of the owner index beats a
--   bitmap scan of the same rows; the planner, blind behind RLS to how many
--   rows one user has, expects few and picks the bitmap scan.
-- * plan_cache_mode = force_generic_plan: the partitions are pruned when a
--   plan starts. A plan made for each call's values prunes them while
--   planning, but planning over the partitioned tables costs more than it
--   saves, and the plan cache, seeing a generic plan's cost summed over all
--   32 partitions, would never switch to one.
-- * Sorting and sequential scans are off while the HNSW statement is
--   planned (so that the planner cannot read the owner index and sort
--   instead, the exact scan's cost), nested loops while the exact scans are
--   (the caller's live sessions are hashed, where a generic plan expecting
--   the average user's one session would read the caller's keys once per
--   session).
create function memchat.recall(
  p_user_id uuid,
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
set plan_cache_mode = force_generic_plan
as $$
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
$$;

-- The HNSW indexes and memchat.nearest_keys_indexed, for this server's
-- pgvector and the column's size.
select memchat.index_recall_keys();
