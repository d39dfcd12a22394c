-- What our PL/pgSQL functions call is planned once per connection on every
-- PostgreSQL version (issue 22).
--
-- Before PostgreSQL 18 (Supabase runs 15 and 17), a SQL-language function
-- the planner does not inline is parsed and planned again each time the
-- statement that calls it runs: its plan lives as long as the caller's
-- execution, not the connection's (18 keeps it in the plan cache). A
-- function with a SET clause or SECURITY DEFINER is never inlined, and ours
-- all set search_path. Seen on PostgreSQL 16 (pgserver 0.1.4), with
-- debug_print_plan: every recall planned 13 statements besides its own
-- cached ones (recall_hits, a join of four tables with two lateral
-- subqueries; answer_of three times; the word list's helpers and the
-- partition lookups), and a stored turn with an embedding 6 (the index_round
-- trigger's helpers). On bench_langgraph.py's data there, recall_hits and
-- answer_of alone cost 0.9 ms of a 4.0 ms recall (docs/benchmarks.md,
-- "Plans kept on every PostgreSQL version").
--
-- PL/pgSQL functions plan their statements through the plan cache on every
-- version. Each function below is the same function in PL/pgSQL: the same
-- arguments, result, volatility, parallel safety, security and settings, the
-- body its SQL statement returned. Their owners and grants are kept (create
-- or replace). The rule since: a SQL-language function that PL/pgSQL calls
-- is one the planner inlines, or a constant (tests/store/test_plans.py).

-- ------------------------------------------------------------ recall's

create or replace function memchat.answer_of(p_message_id bigint) returns text
language plpgsql stable
set search_path = ''
as $$
begin
  return (
    select a.message->'data'->>'content'
      from public.chat_message_history h
      join lateral (
           select x.message from public.chat_message_history x
            where x.user_id = h.user_id and x.session_id = h.session_id and x.id > h.id
              and x.message->>'type' = 'ai'
              and coalesce(jsonb_array_length(x.message->'data'->'tool_calls'), 0) = 0
            order by x.id limit 1) a on true
     where h.id = p_message_id);
end
$$;

create or replace function memchat.recall_hits(
  p_ids bigint[],
  p_scores double precision[],
  p_session_id uuid,
  p_floor bigint
) returns jsonb
language plpgsql stable
set search_path = ''
as $$
begin
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
               'answer', left(memchat.answer_of(b.id), 1000)) end,
             'after', case when a.id is not null then jsonb_build_object(
               'message_id', a.id,
               'question', left(a.message->'data'->>'content', 1000),
               'answer', left(memchat.answer_of(a.id), 1000)) end)
           order by hit.ord)
      from unnest(p_ids, p_scores) with ordinality as hit(id, score, ord)
      join public.chat_message_history h on h.id = hit.id
      join public.chat_sessions s on s.id = h.session_id and s.user_id = h.user_id
      -- The exchange before it in its session (its neighbour): what the hit
      -- often answers or goes on from.
      left join lateral (
           select x.id, x.message from public.chat_message_history x
            where x.user_id = h.user_id and x.session_id = h.session_id and x.id < h.id
              and memchat.embeddable(x.message)
            order by x.id desc limit 1) b on true
      -- The exchange after it: what often answers or corrects it. In the
      -- turn's session, not one of the window's (the prompt shows those).
      left join lateral (
           select x.id, x.message from public.chat_message_history x
            where x.user_id = h.user_id and x.session_id = h.session_id and x.id > h.id
              and (p_session_id is null or x.session_id <> p_session_id or x.id < p_floor)
              and memchat.embeddable(x.message)
            order by x.id limit 1) a on true), '[]'::jsonb);
end
$$;

create or replace function memchat.any_words(p_text text) returns tsquery
language plpgsql immutable parallel safe
set search_path = ''
as $$
begin
  return nullif(array_to_string(array(
           select '''' || replace(replace(l.lexeme, '\', '\\'), '''', '''''') || ''''
             from unnest(tsvector_to_array(to_tsvector('english'::regconfig, coalesce(p_text, ''))))
                  as l(lexeme)), ' | '), '')::tsquery;
end
$$;

create or replace function memchat.rounds_matching(
  p_agent_name text, p_model text, p_words tsquery, p_session_id uuid, p_floor bigint,
  p_limit integer, p_rounds bigint
) returns bigint[]
language plpgsql stable security definer
set search_path = ''
set enable_nestloop = off
as $$
begin
  -- Without a user (claims without `sub`) both are null: no row matches.
  return memchat.owned_rounds_matching(
           auth.uid(), p_agent_name, p_model, p_words,
           pg_catalog.quote_literal(memchat.owner_lexeme(auth.uid()))::tsquery
             operator(pg_catalog.&&) p_words,
           p_session_id, p_floor, p_limit, p_rounds > memchat.words_planned_from());
end
$$;

create or replace function memchat.last_analysed(p_partition regclass)
returns timestamptz
language plpgsql stable
set search_path = ''
as $$
begin
  return coalesce(greatest(pg_catalog.pg_stat_get_last_analyze_time(p_partition),
                           pg_catalog.pg_stat_get_last_autoanalyze_time(p_partition)),
                  '-infinity');
end
$$;

create or replace function memchat.vector_iterative_scans() returns boolean
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

create or replace function memchat.recall_index_ready() returns boolean
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

-- ------------------------------------------------------- partitions

create or replace function memchat.key_partition(p_user_id uuid) returns integer
language plpgsql immutable parallel safe
set search_path = ''
as $$
begin
  return (((pg_catalog.uuid_hash_extended(p_user_id, 8816678312871386365) & 31)
           + (x'49a0f4dd15e5a8e3'::bigint & 31)) & 31)::integer;
end
$$;

create or replace function memchat.key_partition_name(p_table text, p_user_id uuid) returns text
language plpgsql immutable parallel safe
set search_path = ''
as $$
begin
  return p_table || '_p' || pg_catalog.lpad(memchat.key_partition(p_user_id)::text, 2, '0');
end
$$;

create or replace function memchat.key_partition_of(p_table text, p_user_id uuid) returns regclass
language plpgsql stable parallel safe
set search_path = ''
as $$
begin
  return pg_catalog.to_regclass('memchat.' || memchat.key_partition_name(p_table, p_user_id));
end
$$;

-- ------------------------------------------- a stored round's words

create or replace function memchat.owner_lexeme(p_user_id uuid) returns text
language plpgsql immutable parallel safe
set search_path = ''
as $$
begin
  return 'user ' || pg_catalog.replace(p_user_id::text, '-', '');
end
$$;

create or replace function memchat.owned_lexemes(p_lexemes tsvector, p_user_id uuid)
returns tsvector
language plpgsql immutable parallel safe
set search_path = ''
as $$
begin
  return coalesce(p_lexemes, ''::tsvector)
         operator(pg_catalog.||) pg_catalog.array_to_tsvector(array[memchat.owner_lexeme(p_user_id)]);
end
$$;

create or replace function memchat.round_lexemes(p_question text, p_answer text) returns tsvector
language plpgsql immutable parallel safe
set search_path = ''
as $$
begin
  return setweight(to_tsvector('english'::regconfig, coalesce(left(p_question, 8000), '')), 'A')
      || setweight(to_tsvector('english'::regconfig, coalesce(left(p_answer, 8000), '')), 'B');
end
$$;

create or replace function memchat.says_several_things(p_text text) returns boolean
language plpgsql immutable parallel safe
set search_path = ''
as $$
begin
  return coalesce(p_text ~ '[.!?][[:space:]]+[A-Z"''(]', false);
end
$$;

-- ------------------------------------------- requests and the workers

create or replace function memchat.session_expiry(p_ttl interval) returns timestamptz
language plpgsql stable
set search_path = ''
as $$
begin
  return now() + least(p_ttl, (select l.max_session_ttl from memchat.limits l));
end
$$;

create or replace function memchat.current_user_exists() returns boolean
language plpgsql stable security definer
set search_path = ''
as $$
begin
  return exists (select 1 from auth.users u where u.id = (select auth.uid()));
end
$$;

create or replace function memchat.embedding_dimensions() returns integer
language plpgsql stable
set search_path = ''
as $$
begin
  return (select a.atttypmod from pg_catalog.pg_attribute a
           where a.attrelid = 'memchat.message_embeddings'::regclass and a.attname = 'embedding');
end
$$;

-- The queue item a live lease holds (null: expired, taken over, or never).
create or replace function memchat.embedding_leased(p_lease uuid) returns memchat.embedding_queue
language plpgsql stable security definer
set search_path = ''
as $$
declare
  v_item memchat.embedding_queue;
begin
  select q.* into v_item from memchat.embedding_queue q
   where q.lease = p_lease and q.next_attempt_at > now();
  return v_item;
end
$$;

create or replace function memchat.summary_leased(p_lease uuid) returns memchat.summary_queue
language plpgsql stable security definer
set search_path = ''
as $$
declare
  v_item memchat.summary_queue;
begin
  select q.* into v_item from memchat.summary_queue q
   where q.lease = p_lease and q.next_attempt_at > now();
  return v_item;
end
$$;

-- ------------------------------------------- a turn's generic plans

-- A turn's two other calls read and write the caller's rows by key: a plan
-- made for each call's values is no better than the connection's generic
-- one. Left to plan_cache_mode = auto, load_context's notes lookup was
-- planned at every call where the user had no notes (the five custom plans'
-- estimate stayed under the generic plan's), which the plan-count test
-- showed. memchat.recall has kept generic plans since *_key_partitions.sql.
alter function memchat.load_context(uuid, text, integer, boolean, text, text, double precision,
                                    integer, double precision, integer)
  set plan_cache_mode = force_generic_plan;
alter function memchat.record_turn(uuid, text, text, jsonb, interval, text, text, integer, boolean,
                                   extensions.vector, text, integer)
  set plan_cache_mode = force_generic_plan;
