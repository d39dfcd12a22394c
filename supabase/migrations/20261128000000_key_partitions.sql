-- Recall keys partitioned by user (issue 22): memchat.message_embeddings and
-- memchat.message_facts become hash-partitioned by user_id, 32 partitions
-- each, every partition with its own HNSW, GIN and btree indexes.
--
-- Why: a caller's nearest keys come from an HNSW scan filtered to the
-- caller's rows (migration *_recall_at_scale.sql). The scan visits about
-- (keys wanted) / (the caller's share of the keys near the query) entries.
-- In one table of everyone's keys, a query on a topic that many other users
-- talk about found the caller's keys among thousands of others': 110-170 ms
-- per index at 10,000 messages (23,000 buffers read), then the exact scan
-- (docs/benchmarks.md). In the caller's partition the others are a 32nd of
-- them: the same queries read 750-830 buffers, under a millisecond.
--
-- Every statement that names the caller (user_id = ...) reads one partition:
-- the planner prunes the others (for a parameter, when the plan starts).
-- Statements that know only message ids (the cascades of deleted messages)
-- go to each partition directly (memchat.key_partition), as a delete by ids
-- alone would probe all 32 primary keys per id.
--
-- The number of partitions is fixed here. The aim is a partition of a few
-- hundred thousand keys at most; a deployment far beyond 32 times that
-- would re-partition with a migration of its own.

-- ======================================================= which partition
create function memchat.key_partitions() returns integer
language sql immutable parallel safe
set search_path = ''
as $$ select 32 $$;

-- The remainder of p_user_id's partition: PostgreSQL's own hash partitioning
-- of one uuid column (uuid_hash_extended with the partition seed, combined
-- with 0, modulo the partitions). Checked against PostgreSQL's routing at
-- the end of this migration and in tests/store/test_recall_scale.py, so a
-- server hashing otherwise fails loudly instead of deleting from the wrong
-- partition. 32 is a power of two: the remainder is the low bits, which the
-- sum keeps without overflow.
create function memchat.key_partition(p_user_id uuid) returns integer
language sql immutable parallel safe
set search_path = ''
as $$
  select (((pg_catalog.uuid_hash_extended(p_user_id, 8816678312871386365) & 31)
           + (x'49a0f4dd15e5a8e3'::bigint & 31)) & 31)::integer
$$;

-- The name of p_user_id's partition of memchat.<p_table>.
create function memchat.key_partition_name(p_table text, p_user_id uuid) returns text
language sql immutable parallel safe
set search_path = ''
as $$ select p_table || '_p' || pg_catalog.lpad(memchat.key_partition(p_user_id)::text, 2, '0') $$;

-- The same as a relation (null when there is no such table).
create function memchat.key_partition_of(p_table text, p_user_id uuid) returns pg_catalog.regclass
language sql stable parallel safe
set search_path = ''
as $$ select pg_catalog.to_regclass('memchat.' || memchat.key_partition_name(p_table, p_user_id)) $$;

-- ======================================================= the tables again
-- The rows are copied into partitioned tables of the same columns (the
-- vector's size as the deployment chose it), which then take the old names.
create table memchat.message_embeddings_partitioned
  (like memchat.message_embeddings including defaults including constraints including storage
   including comments)
  partition by hash (user_id);
create table memchat.message_facts_partitioned
  (like memchat.message_facts including defaults including constraints including storage
   including comments)
  partition by hash (user_id);
do $$
begin
  for i in 0 .. memchat.key_partitions() - 1 loop
    execute format('create table memchat.%I partition of memchat.message_embeddings_partitioned'
                   ' for values with (modulus %s, remainder %s)',
                   'message_embeddings_p' || lpad(i::text, 2, '0'), memchat.key_partitions(), i);
    execute format('create table memchat.%I partition of memchat.message_facts_partitioned'
                   ' for values with (modulus %s, remainder %s)',
                   'message_facts_p' || lpad(i::text, 2, '0'), memchat.key_partitions(), i);
  end loop;
end
$$;
insert into memchat.message_embeddings_partitioned
  (message_id, user_id, session_id, agent_name, created_at, embedding, model, facts_model, lexemes)
select message_id, user_id, session_id, agent_name, created_at, embedding, model, facts_model,
       lexemes
  from memchat.message_embeddings;
insert into memchat.message_facts_partitioned
  (message_id, ordinal, user_id, session_id, agent_name, created_at, model, embedding)
select message_id, ordinal, user_id, session_id, agent_name, created_at, model, embedding
  from memchat.message_facts;
drop table memchat.message_embeddings;
drop table memchat.message_facts;
alter table memchat.message_embeddings_partitioned rename to message_embeddings;
alter table memchat.message_facts_partitioned rename to message_facts;

comment on table memchat.message_embeddings is
  'The embedding of each stored user message, for recall, partitioned by user '
  '(memchat.key_partition). Goes with its message (trigger chat_message_history_dependents).';
comment on table memchat.message_facts is
  'Extra recall keys of a user message: the embedding of each sentence in which the user '
  'speaks of themselves (memchat.messages.fact_sentences), partitioned by user '
  '(memchat.key_partition). Goes with its message (trigger chat_message_history_dependents).';

-- A unique key of a partitioned table holds the partition's column.
alter table memchat.message_embeddings add primary key (message_id, user_id);
alter table memchat.message_facts add primary key (message_id, ordinal, user_id);
create index message_embeddings_owner_idx on memchat.message_embeddings (user_id, agent_name);
create index message_facts_owner_idx on memchat.message_facts (user_id, agent_name);
create index message_embeddings_lexemes_idx on memchat.message_embeddings using gin (lexemes)
  with (fastupdate = off);
select memchat.index_recall_keys();

create trigger message_embeddings_index_round
  before insert on memchat.message_embeddings
  for each row execute function memchat.index_round();
create trigger message_embeddings_message
  after insert or update of message_id on memchat.message_embeddings
  for each row execute function memchat.lock_referenced_message();
create trigger message_facts_message
  after insert or update of message_id on memchat.message_facts
  for each row execute function memchat.lock_referenced_message();

-- Row-level security on the tables users read through; the partitions have
-- no grants (only the owner reaches them directly) and deny all besides.
alter table memchat.message_embeddings enable row level security;
alter table memchat.message_facts enable row level security;
do $$
declare
  v_partition regclass;
begin
  for v_partition in
    select i.inhrelid::regclass from pg_catalog.pg_inherits i
     where i.inhparent in ('memchat.message_embeddings'::regclass, 'memchat.message_facts'::regclass)
  loop
    execute format('alter table %s enable row level security', v_partition);
    execute format('revoke all on %s from public', v_partition);
  end loop;
end
$$;
revoke all on memchat.message_embeddings, memchat.message_facts from public;
grant select, insert on memchat.message_embeddings to memchat_user;
grant select on memchat.message_facts to memchat_user;
create policy message_embeddings_select on memchat.message_embeddings
  for select to memchat_user using (user_id = (select auth.uid()));
create policy message_embeddings_insert on memchat.message_embeddings
  for insert to memchat_user with check (
    user_id = (select auth.uid())
    and exists (select 1 from public.chat_message_history h
                where h.id = message_id and h.user_id = (select auth.uid())
                  and h.session_id = message_embeddings.session_id));
create policy message_facts_select on memchat.message_facts for select to memchat_user
  using (user_id = (select auth.uid()));

analyze memchat.message_embeddings, memchat.message_facts;

-- ======================================================= statements by message id
-- As in migration *_facts_made.sql, each key table's rows deleted partition
-- by partition: the messages' ids grouped by their owner's partition.
create or replace function memchat.delete_message_dependents() returns trigger
language plpgsql security definer
set search_path = ''
as $$
declare
  -- As an array, so each delete is a primary-key lookup per id whatever the
  -- statement's size (a transition table has no statistics to plan a join by).
  ids bigint[] := array(select g.id from gone g);
  v_part record;
begin
  -- Each statement is planned when it runs (EXECUTE); the ids come through a
  -- subquery, so that the planner does not estimate every one of them (what
  -- a plan of the array's value would do, a millisecond per thousand ids).
  -- One partition computed per row; its tables named once per partition,
  -- from one of its users.
  for v_part in
    select (array_agg(g.user_id))[1] as owner, array_agg(g.id) as ids
      from gone g group by memchat.key_partition(g.user_id)
  loop
    execute format('delete from memchat.%I e where e.message_id = any((select $1)::bigint[])',
                   memchat.key_partition_name('message_embeddings', v_part.owner))
      using v_part.ids;
    execute format('delete from memchat.%I f where f.message_id = any((select $1)::bigint[])',
                   memchat.key_partition_name('message_facts', v_part.owner))
      using v_part.ids;
  end loop;
  delete from memchat.message_facts_made m where m.message_id = any(ids);
  delete from memchat.message_feedback f where f.message_id = any(ids);
  perform set_config('memchat.deleted_messages',
    (coalesce(nullif(current_setting('memchat.deleted_messages', true), ''), '0')::bigint
     + cardinality(ids))::text, true);
  return null;
end
$$;

-- As in migration *_embedding_models.sql, with the key's owner.
create or replace function memchat.embedding_save(
  p_leases uuid[], p_model text, p_ids bigint[], p_embeddings text[]
) returns integer
language sql
security definer
set search_path = ''
as $$
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
  select count(*)::integer from stored
$$;

-- As in migration *_facts_made.sql, each lookup by its owner too.
create or replace function memchat.facts_save(
  p_done_leases uuid[], p_done bigint[], p_model text,
  p_ids bigint[], p_ordinals integer[], p_embeddings text[]
) returns integer
language plpgsql
security definer
set search_path = ''
as $$
declare
  v_done bigint[];
  v_owners uuid[];
  v_marked integer;
begin
  select array_agg(e.message_id), array_agg(distinct e.user_id) into v_done, v_owners
    from unnest(p_done_leases, p_done) as x(lease, id)
    join memchat.embedding_queue q on q.lease = x.lease and q.next_attempt_at > now()
    join memchat.message_embeddings e
      on e.message_id = x.id and e.user_id = q.user_id and e.session_id = q.session_id
   where e.model = p_model;
  if v_done is null then
    return 0;
  end if;
  delete from memchat.message_facts f where f.message_id = any(v_done) and f.user_id = any(v_owners);
  insert into memchat.message_facts
      (message_id, ordinal, user_id, session_id, agent_name, created_at, model, embedding)
  select e.message_id, x.ordinal, e.user_id, e.session_id, e.agent_name, e.created_at, p_model,
         x.embedding::extensions.vector
    from unnest(p_ids, p_ordinals, p_embeddings) as x(id, ordinal, embedding)
    join memchat.message_embeddings e on e.message_id = x.id
   where e.message_id = any(v_done) and e.user_id = any(v_owners);
  insert into memchat.message_facts_made as m (message_id, user_id, model)
  select e.message_id, e.user_id, p_model
    from memchat.message_embeddings e
   where e.message_id = any(v_done) and e.user_id = any(v_owners)
  on conflict (message_id) do update set model = excluded.model;
  get diagnostics v_marked = row_count;
  return v_marked;
end
$$;

-- As in migration *_facts_made.sql, the embedding looked up in its owner's
-- partition.
create or replace function memchat.unembedded_messages(
  p_user_id uuid, p_session_id uuid, p_model text
)
returns setof public.chat_message_history
language sql stable
as $$
  select h.* from public.chat_message_history h
   where h.user_id = p_user_id and h.session_id = p_session_id
     and memchat.embeddable(h.message)
     and not exists (select 1 from memchat.message_embeddings e
                      where e.message_id = h.id and e.user_id = p_user_id
                        and (p_model is null or e.model = p_model)
                        and (e.facts_model is not distinct from e.model
                             or exists (select 1 from memchat.message_facts_made m
                                         where m.message_id = e.message_id
                                           and m.model = e.model)))
$$;

-- As in migration *_embedding_models.sql, the embedding looked up in its
-- owner's partition.
create or replace function memchat.embedding_source(
  p_lease uuid, p_model text, p_after bigint, p_limit integer
) returns jsonb
language sql stable
security definer
set search_path = ''
as $$
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
           limit p_limit) m
$$;

-- ======================================================= recall
-- As in migration *_recall_at_scale.sql, the commonest words by the
-- statistics of the caller's partition (the rows the words list reads;
-- autovacuum analyses partitions, never their parent).
create or replace function memchat.rarer_words(p_words tsquery, p_rounds bigint, p_budget integer)
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
   where s.schemaname = 'memchat'
     and s.tablename = memchat.key_partition_name('message_embeddings', auth.uid())
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
grant execute on function memchat.rarer_words(tsquery, bigint, integer) to memchat_user;

-- As in migration *_recall_at_scale.sql: the HNSW path judged by the rows of
-- the caller's partition (where its scan runs), the fused candidates' keys
-- read there, and its statements' plans generic (below).
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
                       where x.message_id = f.id and x.user_id = v_uid
                         and x.model = p_model)) as score
      from fused f
      join memchat.message_embeddings e on e.message_id = f.id and e.user_id = v_uid
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

revoke all on function memchat.key_partitions(), memchat.key_partition(uuid),
  memchat.key_partition_name(text, uuid), memchat.key_partition_of(text, uuid) from public;
grant execute on function memchat.key_partition(uuid), memchat.key_partition_name(text, uuid),
  memchat.key_partition_of(text, uuid)
  to memchat_user;

-- PostgreSQL routes rows as memchat.key_partition says (see above).
do $$
declare
  v_user uuid;
begin
  for i in 1 .. 200 loop
    v_user := gen_random_uuid();
    if not pg_catalog.satisfies_hash_partition('memchat.message_embeddings'::regclass,
             memchat.key_partitions(), memchat.key_partition(v_user), v_user) then
      raise exception 'memchat.key_partition(%) is not the partition PostgreSQL routes it to',
        v_user;
    end if;
  end loop;
end
$$;
