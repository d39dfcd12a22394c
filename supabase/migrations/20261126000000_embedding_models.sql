-- Embeddings from any OpenAI-compatible provider, of any size (issue 22), and
-- the backfill that embeds what no turn did (imported messages).
--
-- * Each stored embedding records the model that made it
--   (OPENAI_EMBEDDING_MODEL); recall compares only embeddings of the model
--   it is asked for, so vectors of different models are never compared.
--   Those stored before this migration have no model recorded (null): the
--   database cannot know which model made them, so they are never recalled
--   until `memchat db reembed` embeds their messages again (or, with
--   --adopt-unknown, marks them as the configured model's).
-- * The embedding queue (memchat.embedding_queue), like the summary queue:
--   the sessions whose user messages need embeddings. The API's role queues
--   the caller's own sessions (memchat.queue_embeddings, after an import)
--   and reads how many of its messages still wait, and how many the
--   backfill gave up on (memchat.embedding_backlog); the worker
--   (`memchat_worker`) leases
--   queue items and acts only through the SECURITY DEFINER functions below,
--   each naming its lease.
-- * Which messages get an embedding is memchat.embeddable (user messages
--   with text), which of them still need one memchat.unembedded_messages:
--   written once, used by every function here.

-- ======================================================= the model
alter table memchat.message_embeddings add column model text;
comment on column memchat.message_embeddings.model is
  'The embedding model that made the vector (OPENAI_EMBEDDING_MODEL); recall compares '
  'only vectors of one model. Null: unknown (stored before models were recorded), never '
  'recalled.';

-- The model whose fact keys the message has (its embedding's model once the
-- backfill stored them, or at once when it says one thing only); null:
-- still to do.
alter table memchat.message_embeddings add column facts_model text;
comment on column memchat.message_embeddings.facts_model is
  'The model whose fact keys (memchat.message_facts) the message has; null: not yet.';

-- ======================================================= which messages
-- A message that gets an embedding: the user's, with text. Not
-- SECURITY DEFINER and without a search_path of its own, so the planner
-- inlines it into each query (it reads no table and names only built-in
-- operators, which pg_catalog resolves first).
create function memchat.embeddable(p_message jsonb) returns boolean
language sql immutable parallel safe
as $$
  select p_message->>'type' = 'human'
     and jsonb_typeof(p_message->'data'->'content') = 'string'
     and p_message->'data'->>'content' ~ '\S'
$$;

-- The embeddable messages of one session that still need the backfill: no
-- embedding of p_model, or one without its fact keys (facts_model; p_model
-- null: no embedding at all, or one whose fact keys are not done). Runs as
-- its caller (inlined as well): under RLS for the API's role, as the owner
-- inside the worker's functions.
create function memchat.unembedded_messages(p_user_id uuid, p_session_id uuid, p_model text)
returns setof public.chat_message_history
language sql stable
as $$
  select h.* from public.chat_message_history h
   where h.user_id = p_user_id and h.session_id = p_session_id
     and memchat.embeddable(h.message)
     and not exists (select 1 from memchat.message_embeddings e
                      where e.message_id = h.id and (p_model is null or e.model = p_model)
                        and e.facts_model is not distinct from e.model)
$$;

-- ======================================================= the queue
create table memchat.embedding_queue (
  session_id uuid not null,
  user_id uuid not null,
  due_since timestamptz not null default now(),
  attempts integer not null default 0 check (attempts >= 0),
  -- A claim leases the row until then; a failure backs off until then;
  -- 'infinity': given up until the session is queued again.
  next_attempt_at timestamptz not null default now(),
  -- The token the worker's functions take: only a claimed, unexpired item
  -- can be read or written by the worker.
  lease uuid,
  primary key (session_id, user_id),
  foreign key (session_id, user_id) references public.chat_sessions (id, user_id)
    on delete cascade
);
comment on table memchat.embedding_queue is
  'Sessions whose user messages need embeddings (the backfill: usecases/backfill.py).';
create index embedding_queue_next_idx on memchat.embedding_queue (next_attempt_at);
create unique index embedding_queue_lease_idx on memchat.embedding_queue (lease)
  where lease is not null;

alter table memchat.embedding_queue enable row level security;
-- Supabase's default privileges may grant new tables to its API roles.
revoke all on memchat.embedding_queue from public, anon, authenticated, service_role;
-- The caller's own sessions only (the foreign key says the same).
grant select, insert, update on memchat.embedding_queue to memchat_user;
create policy embedding_queue_own on memchat.embedding_queue for all to memchat_user
  using (user_id = (select auth.uid()))
  with check (user_id = (select auth.uid()) and exists (
    select 1 from public.chat_sessions s
     where s.id = embedding_queue.session_id and s.user_id = (select auth.uid())));

-- ======================================================= the API's side
-- Queue the caller's own sessions among p_session_ids (others' and unknown
-- ids are ignored) for their messages' embeddings. A session already queued
-- stays as it is, but one given up is ready again. Returns how many of the
-- ids are the caller's sessions. Runs as the caller, under RLS.
create function memchat.queue_embeddings(p_session_ids uuid[]) returns integer
language sql
set search_path = ''
as $$
  with mine as (
    select s.id, s.user_id from public.chat_sessions s
     where s.id = any(p_session_ids) and s.user_id = (select auth.uid())
  ), queued as (
    insert into memchat.embedding_queue as q (session_id, user_id)
    select m.id, m.user_id from mine m
    on conflict (session_id, user_id) do update set attempts = 0, next_attempt_at = now()
     where q.next_attempt_at = 'infinity'
    returning 1
  )
  select count(*)::integer from mine
$$;

-- The caller's messages without an embedding in its live queued sessions:
-- `pending`, those the backfill will embed (their session waits, is leased
-- or backs off); `failed`, those of sessions it gave up on ('infinity':
-- never embedded until the session is queued again). Both 0: its imports
-- are recallable. Runs as the caller, under RLS.
create function memchat.embedding_backlog(out pending integer, out failed integer)
language sql stable
set search_path = ''
as $$
  select (count(*) filter (where q.next_attempt_at <> 'infinity'))::integer,
         (count(*) filter (where q.next_attempt_at = 'infinity'))::integer
    from memchat.embedding_queue q
    join public.chat_sessions s on s.id = q.session_id and s.user_id = q.user_id
    cross join lateral memchat.unembedded_messages(q.user_id, q.session_id, null) u
   where q.user_id = (select auth.uid())
     and s.status = 'active' and s.expires_at > now()
$$;

-- ======================================================= the worker's side
-- Lease up to p_limit due items for p_lease_seconds (FOR UPDATE SKIP LOCKED:
-- another worker skips them): [{"lease", "session_id", "attempts"}].
create function memchat.embedding_claim(p_limit integer, p_lease_seconds double precision)
returns jsonb
language sql
security definer
set search_path = ''
as $$
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
    from leased l
$$;

-- The queue item a live lease holds (no row: expired, taken over, or never).
create function memchat.embedding_leased(p_lease uuid) returns memchat.embedding_queue
language sql stable
security definer
set search_path = ''
as $$
  select q.* from memchat.embedding_queue q
   where q.lease = p_lease and q.next_attempt_at > now()
$$;

-- Up to p_limit messages of a leased item's session that need the
-- backfill for p_model, after message p_after, oldest first: [{"id", "text",
-- "embedded"}] ("embedded": it has its embedding of p_model, only its fact
-- keys are missing); [] when none is left, the session is no longer live or
-- the lease is gone.
create function memchat.embedding_source(
  p_lease uuid, p_model text, p_after bigint, p_limit integer
) returns jsonb
language sql stable
security definer
set search_path = ''
as $$
  select coalesce(jsonb_agg(jsonb_build_object(
           'id', m.id, 'text', m.message->'data'->>'content',
           'embedded', exists (select 1 from memchat.message_embeddings e
                                where e.message_id = m.id and e.model = p_model))
           order by m.id), '[]'::jsonb)
    from (select u.id, u.message
            from memchat.embedding_leased(p_lease) q
            join public.chat_sessions s on s.id = q.session_id and s.user_id = q.user_id
           cross join lateral memchat.unembedded_messages(q.user_id, q.session_id, p_model) u
           where s.status = 'active' and s.expires_at > now() and u.id > p_after
           order by u.id
           limit p_limit) m
$$;

-- Store embeddings of p_model: p_embeddings[i] (pgvector's text form: the
-- worker may not use the extensions schema) for message p_ids[i], which
-- must be a message to embed of the session leased by p_leases[i] (a live
-- lease). An embedding of another model (or of none) is replaced; one of
-- p_model (a turn's, stored meanwhile) is kept. Returns how many were stored.
create function memchat.embedding_save(
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
    on conflict (message_id) do update
       set model = excluded.model, embedding = excluded.embedding
     where e.model is distinct from excluded.model
    returning 1
  )
  select count(*)::integer from stored
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
begin
  if v_item.session_id is null then
    return false;
  end if;
  if exists (
       select 1 from public.chat_sessions s
        cross join lateral memchat.unembedded_messages(s.user_id, s.id, p_model) u
        where s.id = v_item.session_id and s.user_id = v_item.user_id
          and s.status = 'active' and s.expires_at > now()) then
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
language sql
security definer
set search_path = ''
as $$
  update memchat.embedding_queue q
     set attempts = q.attempts + 1,
         lease = null,
         next_attempt_at = case when p_retry_in is null then 'infinity'::timestamptz
                                else now() + make_interval(secs => p_retry_in) end
   where q.lease = p_lease and q.next_attempt_at > now()
  returning q.attempts
$$;

revoke all on function memchat.embeddable(jsonb),
  memchat.unembedded_messages(uuid, uuid, text),
  memchat.queue_embeddings(uuid[]),
  memchat.embedding_backlog(),
  memchat.embedding_claim(integer, double precision),
  memchat.embedding_leased(uuid),
  memchat.embedding_source(uuid, text, bigint, integer),
  memchat.embedding_save(uuid[], text, bigint[], text[]),
  memchat.embedding_done(uuid, text),
  memchat.embedding_failed(uuid, double precision) from public;
grant execute on function memchat.embeddable(jsonb),
  memchat.unembedded_messages(uuid, uuid, text),
  memchat.queue_embeddings(uuid[]),
  memchat.embedding_backlog() to memchat_user;
-- The worker also reads the column's size, to embed nothing that cannot be stored.
grant execute on function memchat.embedding_claim(integer, double precision),
  memchat.embedding_source(uuid, text, bigint, integer),
  memchat.embedding_save(uuid[], text, bigint[], text[]),
  memchat.embedding_done(uuid, text),
  memchat.embedding_failed(uuid, double precision),
  memchat.embedding_dimensions() to memchat_worker;

-- ======================================================= recall, by model
-- recall, comparing only embeddings of one model: made again, hybrid, by
-- the next migration (*_hybrid_recall.sql), which lands with this one.
drop function memchat.recall(uuid, text, integer, extensions.vector, integer, double precision,
                             double precision);

-- ======================================================= record_turn, with the model
-- record_turn, as before, and: p_embedding_model, the model that made
-- p_embedding, stored with it.
drop function memchat.record_turn(uuid, text, text, jsonb, interval, text, text, integer, boolean,
                                  extensions.vector, integer);

create function memchat.record_turn(
  p_session_id uuid,
  p_agent_name text,
  p_title text,
  p_messages jsonb,
  p_ttl interval,
  p_client_message_id text,
  p_notes text,
  p_notes_version integer,
  p_new_session boolean,
  p_embedding extensions.vector,
  p_embedding_model text,
  p_due_after integer
) returns jsonb
language plpgsql
set search_path = ''
as $$
declare
  v_uid uuid := auth.uid();
  v_count integer := jsonb_array_length(p_messages);
  v_session public.chat_sessions;
  v_expired boolean;
  v_active uuid;
  v_ids bigint[];
  v_prompt bigint;
  v_completion bigint;
begin
  -- The turn's token usage: what its assistant messages carry (LangChain's
  -- usage_metadata; the final answer holds the whole turn's).
  select coalesce(sum((m->'data'->'usage_metadata'->>'input_tokens')::bigint), 0),
         coalesce(sum((m->'data'->'usage_metadata'->>'output_tokens')::bigint), 0)
    into v_prompt, v_completion
    from jsonb_array_elements(p_messages) m
   where m->>'type' = 'ai' and jsonb_typeof(m->'data'->'usage_metadata') = 'object';

  if p_new_session then
    -- Serialises the first turns of one (user, agent); the lock ends with
    -- the transaction, so it is safe behind a transaction-mode pooler.
    perform pg_advisory_xact_lock(
      hashtextextended('memchat.new_session/' || v_uid::text || '/' || p_agent_name, 0));
    select s.id into v_active
      from public.user_agent_active_sessions a
      join public.chat_sessions s on s.id = a.active_session_id and s.user_id = a.user_id
     where a.user_id = v_uid and a.agent_name = p_agent_name
       and s.status = 'active' and s.expires_at > now();
    p_session_id := coalesce(v_active, p_session_id);
  end if;

  select s.expires_at <= now() into v_expired
    from public.chat_sessions s where s.id = p_session_id and s.user_id = v_uid for update;
  if v_expired then
    delete from public.chat_message_history h
     where h.user_id = v_uid and h.session_id = p_session_id;
  end if;

  insert into public.chat_sessions as s
      (id, user_id, agent_name, title, message_count, last_active_at, expires_at,
       turn_count, prompt_tokens, completion_tokens)
  values (p_session_id, v_uid, p_agent_name, p_title, v_count, now(),
          memchat.session_expiry(p_ttl), 1, v_prompt, v_completion)
  on conflict (id, user_id) do update set
      message_count = case when s.expires_at <= now() then excluded.message_count
                           else s.message_count + excluded.message_count end,
      turn_count = case when s.expires_at <= now() then 1 else s.turn_count + 1 end,
      prompt_tokens = case when s.expires_at <= now() then excluded.prompt_tokens
                           else s.prompt_tokens + excluded.prompt_tokens end,
      completion_tokens = case when s.expires_at <= now() then excluded.completion_tokens
                               else s.completion_tokens + excluded.completion_tokens end,
      summary = case when s.expires_at <= now() then null else s.summary end,
      summary_covers_until =
        case when s.expires_at <= now() then null else s.summary_covers_until end,
      summary_covers_count =
        case when s.expires_at <= now() then 0 else s.summary_covers_count end,
      summary_updated_at =
        case when s.expires_at <= now() then null else s.summary_updated_at end,
      title = coalesce(s.title, excluded.title),
      status = 'active',
      last_active_at = excluded.last_active_at,
      expires_at = excluded.expires_at
  returning s.* into v_session;

  with inserted as (
    insert into public.chat_message_history (session_id, user_id, message, client_message_id)
    select p_session_id, v_uid, m.message, case when m.ord = 1 then p_client_message_id end
      from jsonb_array_elements(p_messages) with ordinality as m(message, ord)
     order by m.ord
    returning id)
  select array_agg(i.id order by i.id) into v_ids from inserted i;

  -- The first message of a turn is the user's.
  if p_embedding is not null then
    insert into memchat.message_embeddings
        (message_id, user_id, session_id, agent_name, created_at, model, embedding)
    values (v_ids[1], v_uid, p_session_id, v_session.agent_name, now(), p_embedding_model,
            p_embedding);
  end if;

  insert into public.user_agent_active_sessions as a
      (user_id, agent_name, active_session_id, last_active_at)
  values (v_uid, v_session.agent_name, p_session_id, now())
  on conflict (user_id, agent_name) do update set
      active_session_id = excluded.active_session_id,
      last_active_at = excluded.last_active_at;

  if p_notes is not null then
    perform memchat.save_notes(v_session.agent_name, p_notes, p_notes_version);
  end if;

  if p_client_message_id is not null then
    delete from memchat.turn_claims c
     where c.user_id = v_uid and c.client_message_id = p_client_message_id;
  end if;

  if p_due_after is not null
     and v_session.message_count - v_session.summary_covers_count >= p_due_after then
    insert into memchat.summary_queue as q (session_id, user_id)
    values (p_session_id, v_uid)
    on conflict (session_id, user_id) do update set attempts = 0, next_attempt_at = now()
     where q.next_attempt_at = 'infinity';
  end if;

  -- The ids of the turn's messages, in order: the user's first, the answer last.
  return to_jsonb(v_session) || jsonb_build_object('message_ids', to_jsonb(v_ids));
end
$$;

revoke all on function
  memchat.record_turn(uuid, text, text, jsonb, interval, text, text, integer, boolean,
                      extensions.vector, text, integer)
  from public;
grant execute on function
  memchat.record_turn(uuid, text, text, jsonb, interval, text, text, integer, boolean,
                      extensions.vector, text, integer)
  to memchat_user;
