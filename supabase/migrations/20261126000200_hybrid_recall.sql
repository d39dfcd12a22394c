-- Hybrid recall (issue 22): what recall finds by meaning (the vector) and by
-- words (Postgres full text), fused by reciprocal rank in one statement, at
-- a point in time, optionally favouring a period.
--
-- * Each embedded user message also keeps the lexemes of its round: the
--   message with the answer it got (memchat.round_lexemes; the message's
--   words weigh more than the answer's). A trigger fills them on insert,
--   from whichever path stores the embedding (a turn, the backfill), so
--   the rule lives in one place. A GIN index finds the rows holding a word;
--   the caller's rows among them come from ANDing it with the owner index.
-- * Fact keys: a user message that says several things ("I'm planning a
--   trip to Miami. By the way, I got my engagement ring resized last
--   week.") is found by each of its sentences in which the user speaks of
--   themselves, embedded apart (memchat.message_facts; the sentences are
--   chosen by memchat.messages.fact_sentences). A message's own embedding
--   is stored by its turn (or the backfill); its fact keys always by the
--   backfill, off the user's path: an embedding row whose message says
--   several things waits (facts_model null) and queues its session.
-- * memchat.recall ranks three candidate lists, each of the caller's live
--   rows of one agent and model:
--   the nearest by vector; the best full-text matches of p_text, any of its
--   words (websearch syntax: "quoted phrases", -excluded), by ts_rank;
--   and, when a period [p_from, p_until) is given (a time expression in the
--   message, read by the API), the nearest by vector within it. A
--   candidate's fused score is the sum of 1 / (60 + rank) over the lists it
--   is in (reciprocal rank fusion, k = 60). The similarity floor
--   (p_min_score, against the nearest of the message's keys) applies to
--   every candidate, however it was found: an operator's floor holds.
--   Near-duplicates are collapsed as before. Each hit comes with the
--   exchange before it in its session ("before"), which the prompt shows
--   while the token budget allows.

-- ======================================================= fact keys
-- Whether a message says several things: a sentence end followed by more
-- (memchat.messages._SENTENCE_END, the same rule). Only such messages get
-- fact keys.
create function memchat.says_several_things(p_text text) returns boolean
language sql immutable parallel safe
set search_path = ''
as $$
  select coalesce(p_text ~ '[.!?][[:space:]]+[A-Z"''(]', false)
$$;

create table memchat.message_facts (
  message_id bigint not null,  -- goes with its message: the triggers below
  ordinal smallint not null check (ordinal >= 0),
  user_id uuid not null,
  session_id uuid not null,
  agent_name text not null,
  created_at timestamptz not null,
  model text not null,
  embedding extensions.vector(512) not null,
  primary key (message_id, ordinal)
);
comment on table memchat.message_facts is
  'Extra recall keys of a user message: the embedding of each sentence in which the user '
  'speaks of themselves (memchat.messages.fact_sentences). Goes with its message '
  '(trigger chat_message_history_dependents).';
-- The same size as the messages' embeddings, whatever a deployment chose;
-- then kept in the row (MAIN), as theirs are (migration *_recall.sql): a
-- type change resets the storage to pgvector's EXTERNAL, which would put
-- every key in the TOAST table and cost recall four reads more per key.
do $$
begin
  execute format('alter table memchat.message_facts alter column embedding type extensions.vector(%s)',
                 memchat.embedding_dimensions());
end
$$;
alter table memchat.message_facts alter column embedding set storage main;
create index message_facts_owner_idx on memchat.message_facts (user_id, agent_name);

-- Fact keys go with their message as its embedding does, a statement at a
-- time (migration *_set_based_cascades.sql: no per-row foreign key).
create or replace function memchat.delete_message_dependents() returns trigger
language plpgsql security definer
set search_path = ''
as $$
declare
  -- As an array, so each delete is a primary-key lookup per id whatever the
  -- statement's size (a transition table has no statistics to plan a join by).
  ids bigint[] := array(select g.id from gone g);
begin
  delete from memchat.message_embeddings e where e.message_id = any(ids);
  delete from memchat.message_facts f where f.message_id = any(ids);
  delete from memchat.message_feedback f where f.message_id = any(ids);
  perform set_config('memchat.deleted_messages',
    (coalesce(nullif(current_setting('memchat.deleted_messages', true), ''), '0')::bigint
     + cardinality(ids))::text, true);
  return null;
end
$$;

create or replace function memchat.truncate_message_dependents() returns trigger
language plpgsql security definer
set search_path = ''
as $$
begin
  -- A `truncate ... cascade` may have truncated one of them already, in this
  -- same statement (message_feedback references the sessions): a second
  -- truncate of it is refused (object_in_use), so it is emptied by a delete.
  begin
    truncate memchat.message_embeddings;
  exception when object_in_use then
    delete from memchat.message_embeddings;
  end;
  begin
    truncate memchat.message_facts;
  exception when object_in_use then
    delete from memchat.message_facts;
  end;
  begin
    truncate memchat.message_feedback;
  exception when object_in_use then
    delete from memchat.message_feedback;
  end;
  return null;
end
$$;

create trigger message_facts_message
  after insert or update of message_id on memchat.message_facts
  for each row execute function memchat.lock_referenced_message();
alter table memchat.message_facts enable row level security;
revoke all on memchat.message_facts from public, anon, authenticated, service_role;
grant select on memchat.message_facts to memchat_user;
create policy message_facts_select on memchat.message_facts for select to memchat_user
  using (user_id = (select auth.uid()));

-- ======================================================= the round's lexemes
create function memchat.round_lexemes(p_question text, p_answer text) returns tsvector
language sql immutable parallel safe
set search_path = ''
as $$
  select setweight(to_tsvector('english'::regconfig, coalesce(left(p_question, 8000), '')), 'A')
      || setweight(to_tsvector('english'::regconfig, coalesce(left(p_answer, 8000), '')), 'B')
$$;

-- The words of a message as a query matching any of them (websearch
-- syntax: quoted phrases stay phrases, -word excludes). Null: no words.
create function memchat.any_words(p_text text) returns tsquery
language sql immutable parallel safe
set search_path = ''
as $$
  select nullif(replace(websearch_to_tsquery('english'::regconfig, coalesce(p_text, ''))::text,
                        ' & ', ' | '), '')::tsquery
$$;

alter table memchat.message_embeddings add column lexemes tsvector;
-- In the row too, beside the vector: recall's word list reads them for every
-- candidate, and from TOAST each read would cost several more pages.
alter table memchat.message_embeddings alter column lexemes set storage main;
comment on column memchat.message_embeddings.lexemes is
  'The full-text lexemes of the message''s round: its text (weight A) and its answer''s (B).';

-- The answer a user message got: the first assistant message after it in its
-- session that is not a tool call (as recall reads it).
create function memchat.answer_of(p_message_id bigint) returns text
language sql stable
set search_path = ''
as $$
  select a.message->'data'->>'content'
    from public.chat_message_history h
    join lateral (
         select x.message from public.chat_message_history x
          where x.user_id = h.user_id and x.session_id = h.session_id and x.id > h.id
            and x.message->>'type' = 'ai'
            and coalesce(jsonb_array_length(x.message->'data'->'tool_calls'), 0) = 0
          order by x.id limit 1) a on true
   where h.id = p_message_id
$$;

create function memchat.index_round() returns trigger
language plpgsql
set search_path = ''
as $$
declare
  v_text text;
begin
  select h.message->'data'->>'content',
         memchat.round_lexemes(h.message->'data'->>'content', memchat.answer_of(h.id))
    into v_text, new.lexemes
    from public.chat_message_history h
   where h.id = new.message_id;
  if memchat.says_several_things(v_text) then
    new.facts_model := null;
    -- The backfill adds the fact keys (a given-up session is ready again).
    insert into memchat.embedding_queue as q (session_id, user_id)
    values (new.session_id, new.user_id)
    on conflict (session_id, user_id) do update set attempts = 0, next_attempt_at = now()
     where q.next_attempt_at = 'infinity';
  else
    new.facts_model := new.model;
  end if;
  return new;
end
$$;

create trigger message_embeddings_index_round
  before insert on memchat.message_embeddings
  for each row execute function memchat.index_round();

update memchat.message_embeddings e
   set lexemes = memchat.round_lexemes(h.message->'data'->>'content', memchat.answer_of(h.id)),
       facts_model = case when memchat.says_several_things(h.message->'data'->>'content')
                          then null else e.model end
  from public.chat_message_history h
 where h.id = e.message_id;
insert into memchat.embedding_queue (session_id, user_id)
select distinct e.session_id, e.user_id from memchat.message_embeddings e
 where e.facts_model is null
on conflict do nothing;

create index message_embeddings_lexemes_idx
  on memchat.message_embeddings using gin (lexemes);

-- ======================================================= the backfill, with fact keys
-- Store the fact keys of messages p_done[i] (each of the session leased by
-- p_done_leases[i], with its embedding of p_model stored): their keys of
-- any model are replaced by the given ones (p_ids[j], p_ordinals[j],
-- p_embeddings[j]: pgvector's text form), and each is marked done. Returns
-- how many messages were marked.
create function memchat.facts_save(
  p_done_leases uuid[], p_done bigint[], p_model text,
  p_ids bigint[], p_ordinals integer[], p_embeddings text[]
) returns integer
language plpgsql
security definer
set search_path = ''
as $$
declare
  v_done bigint[];
  v_marked integer;
begin
  select array_agg(e.message_id) into v_done
    from unnest(p_done_leases, p_done) as x(lease, id)
    join memchat.embedding_queue q on q.lease = x.lease and q.next_attempt_at > now()
    join memchat.message_embeddings e
      on e.message_id = x.id and e.user_id = q.user_id and e.session_id = q.session_id
   where e.model = p_model;
  if v_done is null then
    return 0;
  end if;
  delete from memchat.message_facts f where f.message_id = any(v_done);
  insert into memchat.message_facts
      (message_id, ordinal, user_id, session_id, agent_name, created_at, model, embedding)
  select e.message_id, x.ordinal, e.user_id, e.session_id, e.agent_name, e.created_at, p_model,
         x.embedding::extensions.vector
    from unnest(p_ids, p_ordinals, p_embeddings) as x(id, ordinal, embedding)
    join memchat.message_embeddings e on e.message_id = x.id
   where e.message_id = any(v_done);
  update memchat.message_embeddings e set facts_model = p_model
   where e.message_id = any(v_done);
  get diagnostics v_marked = row_count;
  return v_marked;
end
$$;

revoke all on function memchat.says_several_things(text),
  memchat.facts_save(uuid[], bigint[], text, bigint[], integer[], text[]) from public;
grant execute on function memchat.says_several_things(text) to memchat_user;
grant execute on function memchat.facts_save(uuid[], bigint[], text, bigint[], integer[], text[])
  to memchat_worker;

-- ======================================================= recall
-- The caller's recall keys of one agent and model in live sessions, outside
-- the window (message ids from p_floor on, in p_session_id): each message's
-- embedding and its fact keys. Inlined into memchat.recall's statements
-- (plain SQL, no SET clause), running with its caller's rights.
create function memchat.recall_keys(
  p_uid uuid, p_agent_name text, p_model text, p_session_id uuid, p_floor bigint
) returns table (message_id bigint, created_at timestamptz, embedding extensions.vector)
language sql stable
as $$
  select e.message_id, e.created_at, e.embedding
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
$$;

create function memchat.recall(
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
as $$
declare
  v_uid uuid := auth.uid();
  v_floor bigint := 9223372036854775807;
  v_words tsquery := memchat.any_words(p_text);
  v_depth integer := greatest(p_k * 4, 20);
  v_meaning bigint[] := '{}';
  v_matching bigint[] := '{}';
  v_period bigint[] := '{}';
  v_kept extensions.vector[] := '{}';
  v_ids bigint[] := '{}';
  v_scores double precision[] := '{}';
  v_candidate record;
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

  -- The lists, each its own statement: the vector scans read the owner
  -- index in order (bitmap scans off, migration *_recall_plan.sql), the
  -- word match needs the GIN index's bitmap.
  -- A message is as near as its nearest key (its own embedding or a fact's).
  v_meaning := array(
    select k.message_id
      from (select k.message_id, k.embedding operator(extensions.<=>) p_query as distance
              from memchat.recall_keys(v_uid, p_agent_name, p_model, p_session_id, v_floor) k
             order by distance
             limit v_depth * 3) k
     group by k.message_id
     order by min(k.distance), k.message_id desc
     limit v_depth);
  if p_from is not null or p_until is not null then
    v_period := array(
      select k.message_id
        from (select k.message_id, k.embedding operator(extensions.<=>) p_query as distance
                from memchat.recall_keys(v_uid, p_agent_name, p_model, p_session_id, v_floor) k
               where k.created_at >= coalesce(p_from, '-infinity')
                 and k.created_at < coalesce(p_until, 'infinity')
               order by distance
               limit v_depth * 3) k
       group by k.message_id
       order by min(k.distance), k.message_id desc
       limit v_depth);
  end if;
  if v_words is not null then
    perform set_config('enable_bitmapscan', 'on', true);
    -- The rows holding any word, best first by ts_rank (normalised by
    -- the round's length: 1 + log; a word in the message (weight A) counts
    -- more than one in its answer (B)). BM25's inverse document frequency,
    -- tried here, scored no better on LongMemEval and cost 3x the time
    -- (docs/benchmarks.md).
    v_matching := array(
      select e.message_id
        from memchat.message_embeddings e
        join public.chat_sessions s on s.id = e.session_id and s.user_id = e.user_id
       where e.user_id = v_uid and e.agent_name = p_agent_name and e.model = p_model
         and s.status = 'active' and s.expires_at > now()
         and (p_session_id is null or e.session_id <> p_session_id or e.message_id < v_floor)
         and e.lexemes operator(pg_catalog.@@) v_words
       order by ts_rank(e.lexemes, v_words, 1) desc, e.message_id desc
       limit v_depth);
  end if;

  for v_candidate in
    with fused as (
      select l.id, sum(1.0 / (60 + l.r)) as fused
        from (select * from unnest(v_meaning) with ordinality as a(id, r)
              union all select * from unnest(v_matching) with ordinality as b(id, r)
              union all select * from unnest(v_period) with ordinality as c(id, r)) l
       group by l.id
    )
    select f.id as message_id, e.embedding, f.fused,
           1 - least(e.embedding operator(extensions.<=>) p_query,
                     (select min(x.embedding operator(extensions.<=>) p_query)
                        from memchat.message_facts x
                       where x.message_id = f.id and x.model = p_model)) as score
      from fused f
      join memchat.message_embeddings e on e.message_id = f.id
     order by f.fused desc, f.id desc
  loop
    exit when cardinality(v_ids) >= p_k;
    continue when v_candidate.score < p_min_score;
    continue when exists (
      select 1 from unnest(v_kept) k(v)
       where 1 - (k.v operator(extensions.<=>) v_candidate.embedding) >= p_collapse);
    v_kept := v_kept || v_candidate.embedding;
    v_ids := v_ids || v_candidate.message_id;
    v_scores := v_scores || v_candidate.score;
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

revoke all on function memchat.recall_keys(uuid, text, text, uuid, bigint) from public;
grant execute on function memchat.recall_keys(uuid, text, text, uuid, bigint) to memchat_user;
revoke all on function memchat.round_lexemes(text, text), memchat.any_words(text),
  memchat.answer_of(bigint), memchat.index_round(),
  memchat.recall(uuid, text, integer, extensions.vector, text, text, integer, double precision,
                 double precision, timestamptz, timestamptz)
  from public;
grant execute on function memchat.round_lexemes(text, text), memchat.any_words(text),
  memchat.answer_of(bigint),
  memchat.recall(uuid, text, integer, extensions.vector, text, text, integer, double precision,
                 double precision, timestamptz, timestamptz)
  to memchat_user;
-- memchat.index_round is a trigger function: it runs as whoever inserts the
-- embedding (a turn: the caller, under RLS; the backfill: the owner, in its
-- SECURITY DEFINER functions), with no grant of its own.
