-- Embeddings from any OpenAI-compatible provider, of any size, and the
-- backfill that embeds what no turn did (imported messages, `memchat db
-- reembed`) and makes the fact keys (tables/recall_keys.sql).
--
-- * Each stored embedding records the model that made it
--   (OPENAI_EMBEDDING_MODEL); recall compares only embeddings of the model
--   it is asked for, so vectors of different models are never compared.
--   One of no recorded model (stored before models were recorded) is never
--   recalled until `memchat db reembed` embeds its message again (or, with
--   --adopt-unknown, marks it as the configured model's).
-- * The embedding queue (memchat.embedding_queue, tables/queues.sql), like
--   the summary queue: the API's role queues the caller's own sessions
--   (memchat.queue_embeddings, after an import) and reads how many of its
--   messages still wait, and how many the backfill gave up on
--   (memchat.embedding_backlog); the worker (`memchat_worker`) leases
--   queue items and acts only through the SECURITY DEFINER functions below,
--   each naming its lease.
-- * Which messages get an embedding is memchat.embeddable (the user's and
--   the assistant's, with text), which of them still need the backfill
--   memchat.unembedded_messages: written once, used by every function here.

-- The stored column's size, for the API's start-up check (and the worker,
-- which embeds nothing that cannot be stored).
create function memchat.embedding_dimensions() returns integer
language plpgsql stable
set search_path = ''
as $$
begin
  return (select a.atttypmod from pg_catalog.pg_attribute a
           where a.attrelid = 'memchat.message_embeddings'::regclass and a.attname = 'embedding');
end
$$;

-- A message that gets an embedding: the user's or the assistant's, with
-- text (an assistant's tool call is neither). Recall finds an exchange by
-- what either side said. Not SECURITY DEFINER and without a search_path of
-- its own, so the planner inlines it into each query (it reads no table and
-- names only built-in operators, which pg_catalog resolves first).
create function memchat.embeddable(p_message jsonb) returns boolean
language sql immutable parallel safe
as $$
  select p_message->>'type' in ('human', 'ai')
     and jsonb_typeof(p_message->'data'->'content') = 'string'
     and p_message->'data'->>'content' ~ '\S'
     and coalesce(jsonb_array_length(p_message->'data'->'tool_calls'), 0) = 0
$$;

-- A message that opens an exchange: the user's, with text. Its answers are
-- the assistant's messages after it, up to the next one (memchat.answer_after).
-- Inlined as memchat.embeddable is.
create function memchat.asked(p_message jsonb) returns boolean
language sql immutable parallel safe
as $$
  select p_message->>'type' = 'human'
     and jsonb_typeof(p_message->'data'->'content') = 'string'
     and p_message->'data'->>'content' ~ '\S'
$$;

-- A message needs work for p_model (null: its own model) while it has no
-- embedding of that model, or its fact keys and memories are due: a user
-- message's, not yet made with its embedding's model. The embeddable
-- messages of one session that do, the embedding looked up in its owner's
-- partition. PL/pgSQL, called in an expression or from a
-- statement that reads no table itself (on Citus a function reading a
-- distributed table cannot run inside one that does: docs/deploy.md). Runs
-- as its caller: under RLS for the API's role, as the owner inside the
-- worker's functions.
create function memchat.unembedded_messages(
  p_user_id uuid, p_session_id uuid, p_model text
)
returns table (id bigint, message jsonb)
language plpgsql stable
set search_path = ''
as $$
begin
  return query
    select h.id, h.message from public.chat_message_history h
     where h.user_id = p_user_id and h.session_id = p_session_id
       and memchat.embeddable(h.message)
       and not exists (select 1 from memchat.message_embeddings e
                        where e.message_id = h.id and e.user_id = p_user_id
                          and (p_model is null or e.model = p_model)
                          and (e.facts_model is not distinct from e.model
                               or exists (select 1 from memchat.message_facts_made m
                                           where m.message_id = e.message_id
                                             and m.user_id = p_user_id
                                             and m.model = e.model)));
end
$$;

-- ------------------------------------------------------- the API's side

-- Queue the caller's own sessions among p_session_ids (others' and unknown
-- ids are ignored) for their messages' embeddings. A session already queued
-- stays as it is, but one given up is ready again. Returns how many of the
-- ids are the caller's sessions. Runs as the caller, under RLS.
create function memchat.queue_embeddings(p_session_ids uuid[]) returns integer
language plpgsql
set search_path = ''
as $$
declare
  -- The caller, a parameter of each statement: on Citus, its shard.
  v_uid uuid := auth.uid();
  -- now() itself in ON CONFLICT DO UPDATE: refused by Citus (docs/deploy.md).
  v_now timestamptz := now();
  v_mine integer;
begin
  with mine as (
    select s.id, s.user_id from public.chat_sessions s
     where s.id = any(p_session_ids) and s.user_id = v_uid
  ), queued as (
    insert into memchat.embedding_queue as q (session_id, user_id)
    select m.id, m.user_id from mine m
    on conflict (session_id, user_id) do update set attempts = 0, next_attempt_at = v_now
     where q.next_attempt_at = 'infinity'
    returning 1
  )
  select count(*)::integer into v_mine from mine;
  return v_mine;
end
$$;

-- The caller's messages without an embedding in its live queued sessions:
-- `pending`, those the backfill will embed (their session waits, is leased
-- or backs off); `failed`, those of sessions it gave up on ('infinity':
-- never embedded until the session is queued again). Both 0: its imports
-- are recallable. Runs as the caller, under RLS.
create function memchat.embedding_backlog(out pending integer, out failed integer)
language plpgsql stable
set search_path = ''
as $$
declare
  -- The caller, a parameter of each statement: on Citus, its shard.
  v_uid uuid := auth.uid();
  v_sessions uuid[];
  v_given_up boolean[];
begin
  -- The queued live sessions first; their messages in a statement that
  -- reads no table itself (memchat.unembedded_messages).
  select coalesce(array_agg(q.session_id), '{}'),
         coalesce(array_agg(q.next_attempt_at = 'infinity'), '{}')
    into v_sessions, v_given_up
    from memchat.embedding_queue q
    join public.chat_sessions s on s.id = q.session_id and s.user_id = v_uid
   where q.user_id = v_uid
     and s.status = 'active' and s.expires_at > now();
  select (count(*) filter (where not q.given_up))::integer,
         (count(*) filter (where q.given_up))::integer
    into pending, failed
    from unnest(v_sessions, v_given_up) q(session_id, given_up)
    cross join lateral memchat.unembedded_messages(v_uid, q.session_id, null) u;
end
$$;

-- ------------------------------------------------------- the worker's side

-- Lease up to p_limit due items for p_lease_seconds (FOR UPDATE SKIP LOCKED:
-- another worker skips them): [{"lease", "session_id", "attempts"}].
create function memchat.embedding_claim(p_limit integer, p_lease_seconds double precision)
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

-- The queue item a live lease holds (null: expired, taken over, or never).
create function memchat.embedding_leased(p_lease uuid) returns memchat.embedding_queue
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

-- Up to p_limit messages of a leased item's session that need the
-- backfill for p_model, after message p_after, oldest first: [{"id", "text",
-- "asked", "embedded"}] ("asked": the user's, memchat.asked; "embedded": it
-- has its embedding of p_model, only its fact keys are missing); [] when none is left, the session is no longer live or
-- the lease is gone.
create function memchat.embedding_source(
  p_lease uuid, p_model text, p_after bigint, p_limit integer
) returns jsonb
language plpgsql stable
security definer
set search_path = ''
as $$
declare
  v_item memchat.embedding_queue := memchat.embedding_leased(p_lease);
  v_ids bigint[];
  v_messages jsonb[];
begin
  if v_item.session_id is null or not exists (
       select 1 from public.chat_sessions s
        where s.id = v_item.session_id and s.user_id = v_item.user_id
          and s.status = 'active' and s.expires_at > now()) then
    return '[]'::jsonb;
  end if;
  -- The messages first, in a statement that reads no table itself
  -- (memchat.unembedded_messages), then whether each has its embedding.
  select coalesce(array_agg(u.id order by u.id), '{}'),
         coalesce(array_agg(u.message order by u.id), '{}')
    into v_ids, v_messages
    from (select u.id, u.message
            from memchat.unembedded_messages(v_item.user_id, v_item.session_id, p_model) u
           where u.id > p_after
           order by u.id
           limit p_limit) u;
  return (
    select coalesce(jsonb_agg(jsonb_build_object(
             'id', m.id, 'text', m.message->'data'->>'content',
             'asked', memchat.asked(m.message),
             'embedded', exists (select 1 from memchat.message_embeddings e
                                  where e.message_id = m.id and e.user_id = v_item.user_id
                                    and e.model = p_model))
             order by m.id), '[]'::jsonb)
      from unnest(v_ids, v_messages) m(id, message));
end
$$;

-- Store embeddings of p_model: p_embeddings[i] (pgvector's text form: the
-- worker may not use the extensions schema) for message p_ids[i], which
-- must be a message to embed of the session leased by p_leases[i] (a live
-- lease). An embedding of another model (or of none) is replaced; one of
-- p_model (a turn's, stored meanwhile) is kept. Returns how many were stored.
create function memchat.embedding_save(
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

-- Store the fact keys of messages p_done[i] (each of the session leased by
-- p_done_leases[i], with its embedding of p_model stored): their keys of
-- any model are replaced by the given ones (p_ids[j], p_ordinals[j],
-- p_embeddings[j]: pgvector's text form), and each is marked made in
-- memchat.message_facts_made. Returns how many messages were marked.
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
  on conflict (message_id, user_id) do update set model = excluded.model;
  get diagnostics v_marked = row_count;
  return v_marked;
end
$$;

-- The end of a leased item's pass: it leaves the queue when none of its
-- session's messages needs an embedding of p_model any more (true), else
-- stays queued, ready now (attempts reset: it made progress, or was cut
-- short). False also when the lease is gone.
create function memchat.embedding_done(p_lease uuid, p_model text) returns boolean
language plpgsql
security definer
set search_path = ''
as $$
declare
  v_item memchat.embedding_queue := memchat.embedding_leased(p_lease);
  v_more boolean := false;
begin
  if v_item.session_id is null then
    return false;
  end if;
  -- Each read in a statement of its own: memchat.unembedded_messages in
  -- one that reads no table itself.
  if exists (
       select 1 from public.chat_sessions s
        where s.id = v_item.session_id and s.user_id = v_item.user_id
          and s.status = 'active' and s.expires_at > now()) then
    v_more := exists (
      select 1 from memchat.unembedded_messages(v_item.user_id, v_item.session_id, p_model));
  end if;
  if v_more then
    update memchat.embedding_queue q set attempts = 0, next_attempt_at = now(), lease = null
     where q.lease = p_lease;
    return false;
  end if;
  delete from memchat.embedding_queue q where q.lease = p_lease;
  return true;
end
$$;

-- A leased item's embeddings failed: retry in p_retry_in seconds (null: not
-- until the session is queued again). Returns the failures in a row.
create function memchat.embedding_failed(p_lease uuid, p_retry_in double precision)
returns integer
language plpgsql
security definer
set search_path = ''
as $$
declare
  v_attempts integer;
  -- Taken first: Citus refuses now() in a CASE of a distributed UPDATE.
  v_retry_at timestamptz := case when p_retry_in is null then 'infinity'::timestamptz
                                 else now() + make_interval(secs => p_retry_in) end;
begin
  update memchat.embedding_queue q
     set attempts = q.attempts + 1,
         lease = null,
         next_attempt_at = v_retry_at
   where q.lease = p_lease and q.next_attempt_at > now()
  returning q.attempts into v_attempts;
  return v_attempts;
end
$$;

-- Young recall-key partitions analysed, then the common words copied
-- (memchat.copy_word_statistics, functions/words.sql). The worker calls it
-- once at the end of each run (usecases/backfill.py; the summary
-- function's schedule), after its rounds.
--
-- Autovacuum analyses a key partition only after 5,000 + 10% of its rows
-- changed (tables/recall_keys.sql), so a young deployment's partitions go
-- unanalysed until they hold 5,000 keys, and a user with a long history in
-- one of them gets slow searches until then: memchat.rarer_words finds no
-- common words to leave out, and memchat.recall judges the HNSW path
-- without the partition's size (docs/benchmarks.md, "Recall right after a
-- large import"). So every partition (and its memchat.message_facts
-- sibling) is analysed here where it holds at least 1,000 keys and never
-- was, or twice as many keys as its statistics count; those counted 5,000
-- or more are left to autovacuum, at the cost of reading pg_class. Each
-- partition is analysed at most a few times in its life (1,000, 2,000,
-- 4,000 keys...), always by a bulk writer, so cached plans are thrown away
-- rarely. The keys are counted, not read from the cumulative statistics
-- (those lag the worker's last writes); the count stops at the number that
-- decides.
create function memchat.embedding_statistics() returns integer
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
    execute pg_catalog.format('select count(*) from (select 1 from %s limit $1) k', v_keys)
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
