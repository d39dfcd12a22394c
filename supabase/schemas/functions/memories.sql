-- Durable memory (tables/memories.sql): written by the backfill, kept past
-- the transcript, found by the same two lists as recall's exchanges.

-- Store memories of p_model for messages of leased sessions: p_texts[i]
-- (kind p_kinds[i], pgvector's text form p_embeddings[i]; null: the
-- message's own embedding of p_model, the memory being all it says) as the
-- p_ordinals[i]-th memory of message p_ids[i], which must be a message of
-- the session leased by p_leases[i] (a live lease). One the user forgot
-- (memchat.forgotten_memories) is never written again; one stored before is
-- replaced (a new embedding model's, `memchat db reembed`). Returns how
-- many were stored.
create function memchat.memories_save(
  p_leases uuid[], p_model text, p_ids bigint[], p_ordinals integer[], p_kinds text[],
  p_texts text[], p_embeddings text[]
) returns integer
language plpgsql
security definer
set search_path = ''
as $$
declare
  v_stored integer;
begin
  with stored as (
    insert into memchat.memories as m
        (user_id, agent_name, kind, text, session_id, message_id, ordinal, created_at,
         model, embedding)
    select h.user_id, s.agent_name, x.kind, x.text, h.session_id, h.id, x.ordinal,
           h.created_at, p_model,
           coalesce(x.embedding::extensions.vector,
                    (select e.embedding from memchat.message_embeddings e
                      where e.message_id = h.id and e.user_id = h.user_id and e.model = p_model))
      from unnest(p_leases, p_ids, p_ordinals, p_kinds, p_texts, p_embeddings)
           as x(lease, id, ordinal, kind, text, embedding)
      join memchat.embedding_queue q on q.lease = x.lease and q.next_attempt_at > now()
      join public.chat_message_history h
        on h.id = x.id and h.user_id = q.user_id and h.session_id = q.session_id
      join public.chat_sessions s on s.id = q.session_id and s.user_id = q.user_id
     where p_model is not null
       and (x.embedding is not null
            or exists (select 1 from memchat.message_embeddings e
                        where e.message_id = h.id and e.user_id = h.user_id
                          and e.model = p_model))
       and not exists (select 1 from memchat.forgotten_memories f
                        where f.message_id = h.id and f.ordinal = x.ordinal
                          and f.user_id = h.user_id)
    on conflict (user_id, message_id, ordinal) do update
       set kind = excluded.kind, text = excluded.text, model = excluded.model,
           embedding = excluded.embedding
    returning 1
  )
  select count(*)::integer into v_stored from stored;
  return v_stored;
end
$$;

-- The end of sessions (trigger chat_sessions_memories, after a delete):
-- the cleanup sets memchat.memory_retention_days for its transaction, and
-- the deleted sessions' memories are kept that many days past each
-- session's expiry; a session deleted by anyone else (its user, through
-- the Data API) takes its memories with it.
create function memchat.keep_memories() returns trigger
language plpgsql security definer
set search_path = ''
as $$
declare
  v_days integer := nullif(current_setting('memchat.memory_retention_days', true), '')::integer;
begin
  if v_days is null then
    delete from memchat.memories m using gone g
     where m.session_id = g.id and m.user_id = g.user_id and m.expires_at is null;
  else
    update memchat.memories m
       set expires_at = g.expires_at + make_interval(days => v_days)
      from gone g
     where m.session_id = g.id and m.user_id = g.user_id and m.expires_at is null;
  end if;
  return null;
end
$$;

-- The caller's memories of p_agent_name that match p_query (its embedding,
-- of p_model) or p_text's words, at most p_limit, best first: the nearest
-- by meaning (an exact scan: a user's memories are few next to their
-- messages) and those holding the rarest of the words (each of p_text's
-- lexemes weighed by how few of the caller's memories hold it, as BM25's
-- idf), fused by reciprocal rank (k = 20, lists 2 * p_limit deep, as
-- recall's); none below p_min_score similarity to p_query, however found
-- (score: that similarity; null without p_query). As recall picks
-- exchanges, each memory taken from a session makes that session's next
-- worth 0.9 times less: several sessions that each say something come
-- before one saying it again. When p_text asks for the present
-- ("now", "currently", "latest", "still", "recently", ...: English cue
-- words), of two of them from different sessions about the same thing
-- (nearer each other than the nearer of them is to p_query, less 0.1) the
-- newer (created_at) is placed first, at the best place of the pair, so
-- that what a user said last about something (an address, a count, a
-- record) comes before what it updates; both stay, each with its date.
-- Without such a word the ranking is left as it is: a question about the
-- past is as likely about the older one. p_durable: only those whose session
-- is gone (expires_at set: recall finds the others through their exchange;
-- a turn's recall reads none of a live session's, however many). Runs as
-- the caller: RLS applies.
create function memchat.search_memories(
  p_agent_name text, p_query extensions.vector, p_model text, p_text text, p_limit integer,
  p_min_score double precision, p_durable boolean
) returns table (id bigint, score double precision)
language plpgsql stable
set search_path = ''
as $$
declare
  -- The caller, a parameter of each statement: on Citus, its shard.
  v_uid uuid := auth.uid();
  v_words tsquery;
  v_lexemes text[];
  v_ids bigint[];
  v_current boolean;
begin
  if p_durable then
    select array_agg(m.id) into v_ids from memchat.memories m
     where m.user_id = v_uid and m.agent_name = p_agent_name
       and m.expires_at is not null;
  else
    select array_agg(m.id) into v_ids from memchat.memories m
     where m.user_id = v_uid and m.agent_name = p_agent_name;
  end if;
  if v_ids is null then
    return;  -- none: the words are not even looked at
  end if;
  v_words := memchat.any_words(p_text);
  v_lexemes := pg_catalog.tsvector_to_array(pg_catalog.to_tsvector('english'::regconfig, coalesce(p_text, '')));
  v_current := p_text ~* '\m(now|current|currently|latest|still|these days|most recent|recently|anymore|at the moment|presently|so far)\M';
  return query
  with own as materialized (
    select m.id, m.model, m.embedding, m.lexemes, m.created_at, m.session_id
      from memchat.memories m
     where m.user_id = v_uid and m.id = any(v_ids)
  ), meaning as (
    select o.id, row_number() over (order by o.embedding operator(extensions.<=>) p_query, o.id desc)
             as r
      from own o
     where p_query is not null and o.model = p_model
     order by r
     limit p_limit * 2
  ), matching as materialized (
    select o.id, l.lexeme
      from own o
     cross join lateral unnest(pg_catalog.tsvector_to_array(o.lexemes)) l(lexeme)
     where v_words is not null and o.lexemes operator(pg_catalog.@@) v_words
       and l.lexeme = any(v_lexemes)
  ), rarity as (
    select m.lexeme,
           ln(1 + (cardinality(v_ids) - count(*) + 0.5) / (count(*) + 0.5)) as weight
      from matching m
     group by m.lexeme
  ), words as (
    select m.id, row_number() over (order by sum(w.weight) desc, m.id desc) as r
      from matching m
      join rarity w on w.lexeme = m.lexeme
     group by m.id
     order by r
     limit p_limit * 2
  ), fused as (
    select coalesce(a.id, b.id) as id,
           coalesce(1.0 / (20 + a.r), 0) + coalesce(1.0 / (20 + b.r), 0) as fused
      from meaning a
      full join words b on b.id = a.id
  ), kept as (
    select f.id, f.fused, x.similarity, o.embedding, o.created_at, o.session_id
      from fused f
      join own o on o.id = f.id
     cross join lateral (
       select case when p_query is not null and o.model = p_model
                   then 1 - (o.embedding operator(extensions.<=>) p_query) end as similarity) x
     where p_query is null or x.similarity >= p_min_score
  ), found as materialized (
    select k.id, k.fused * 0.9 ^ (row_number() over (partition by k.session_id
                                                    order by k.fused desc, k.id desc) - 1)
             as fused,
           k.similarity, k.embedding, k.created_at, k.session_id
      from kept k
     order by 2 desc, k.id desc
     limit p_limit
  )
  select a.id, a.similarity
    from found a
   cross join lateral (
     select max(b.fused) as fused
       from found b
      where b.id = a.id
         or (v_current and a.similarity is not null and b.similarity is not null
             and b.session_id <> a.session_id
             and 1 - (a.embedding operator(extensions.<=>) b.embedding)
                 >= greatest(a.similarity, b.similarity) - 0.1)) pair
   order by pair.fused desc, a.created_at desc, a.id desc;
end
$$;

-- The durable memories an import brings, the caller's (memchat's account
-- export holds the memories of sessions it no longer has: their transcript
-- is gone): p_memories [{"agent_name", "kind", "text", "session_id",
-- "created_at", "expires_at"}], each kept until its expires_at, at most
-- p_retention_days from now (null: that long; none past already, none at
-- all with 0). One the caller has already (the same session, kind, text and
-- time: an export imported twice) is skipped. Each gets a new message id
-- (its message is not imported) and no embedding: the backfill embeds it
-- (memchat.memory_embedding_source). Returns how many were stored.
-- p_user_id: the caller as the API names it (refused unless it is the
-- caller's; on Citus the call is delegated by it to the worker holding that
-- user's shards, where its writes, as the owner, are local).
create function memchat.import_memories(
  p_user_id uuid, p_memories jsonb, p_retention_days integer
)
returns integer
language plpgsql
security definer
set search_path = ''
as $$
declare
  v_user uuid := (select auth.uid());
  v_stored integer;
begin
  if p_user_id is distinct from v_user then
    raise exception 'the caller is not user %', p_user_id using errcode = '42501';
  end if;
  if v_user is null or p_retention_days <= 0 then
    return 0;
  end if;
  with given as (
    select distinct on (x.session_id, x.kind, x.text, x.created_at)
           x.agent_name, x.kind, x.text, x.session_id, x.created_at,
           least(coalesce(x.expires_at, 'infinity'),
                 now() + make_interval(days => p_retention_days)) as expires_at
      from jsonb_to_recordset(p_memories)
           as x(agent_name text, kind text, text text, session_id uuid,
                created_at timestamptz, expires_at timestamptz)
     order by x.session_id, x.kind, x.text, x.created_at
  ), stored as (
    insert into memchat.memories
        (user_id, agent_name, kind, text, session_id, message_id, ordinal, created_at,
         expires_at)
    select v_user, g.agent_name, g.kind, g.text, g.session_id,
           nextval(pg_catalog.pg_get_serial_sequence('public.chat_message_history', 'id')),
           case g.kind when 'summary' then -1 else 0 end, g.created_at, g.expires_at
      from given g
     where g.expires_at > now()
       and not exists (select 1 from memchat.memories m
                        where m.user_id = v_user and m.session_id = g.session_id
                          and m.kind = g.kind and m.text = g.text
                          and m.created_at = g.created_at)
    returning 1
  )
  select count(*)::integer into v_stored from stored;
  return v_stored;
end
$$;

-- The backfill's memories without an embedding (imported ones, those of a
-- column resized: `memchat db reembed --dimensions`), at most p_limit, in
-- id order after p_after: [{"id", "user_id", "text"}].
create function memchat.memory_embedding_source(p_after bigint, p_limit integer)
returns jsonb
language plpgsql stable
security definer
set search_path = ''
as $$
begin
  return (
  select coalesce(jsonb_agg(jsonb_build_object('id', m.id, 'user_id', m.user_id, 'text', m.text)
                            order by m.id), '[]'::jsonb)
    from (select m.id, m.user_id, m.text from memchat.memories m
           where m.embedding is null and m.id > p_after
           order by m.id
           limit p_limit) m);
end
$$;

-- Store embeddings of p_model (pgvector's text form p_embeddings[i]) for
-- memories p_ids[i] of users p_users[i], those still without one. Returns
-- how many were stored.
create function memchat.memory_embedding_save(
  p_ids bigint[], p_users uuid[], p_model text, p_embeddings text[]
) returns integer
language plpgsql
security definer
set search_path = ''
as $$
declare
  v_stored integer;
begin
  update memchat.memories m
     set embedding = x.embedding::extensions.vector, model = p_model
    from unnest(p_ids, p_users, p_embeddings) as x(id, user_id, embedding)
   where m.id = x.id and m.user_id = x.user_id and m.embedding is null;
  get diagnostics v_stored = row_count;
  return v_stored;
end
$$;

-- Recall's durable memories (store.recall, in the pipeline that runs
-- memchat.recall): the caller's memories of p_agent_name whose session is
-- gone that match (memchat.search_memories), as [{"memory_id", "kind",
-- "text", "session_id", "message_id", "created_at", "score"}] best first;
-- a caller with none costs one index probe. Runs as the caller: RLS
-- applies; p_user_id is the caller as the API names it (on Citus, the call
-- is delegated by it to the worker holding that user's shards).
create function memchat.recall_memories(
  p_user_id uuid, p_agent_name text, p_query extensions.vector, p_model text, p_text text,
  p_limit integer, p_min_score double precision
) returns jsonb
language plpgsql stable
set search_path = ''
as $$
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
$$;
