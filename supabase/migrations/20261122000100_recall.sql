-- Recall across conversations (issue 10): every stored user message gets an
-- embedding, and a new message's embedding finds the caller's similar
-- earlier messages, by cosine similarity, under row-level security.

-- pgvector, where Supabase keeps extensions (infra/bootstrap.sql makes the
-- same schema on plain PostgreSQL).
create extension if not exists vector with schema extensions;

-- ------------------------------------------------------------ embeddings
-- One row per embedded user message; it goes with its message (clear-session,
-- delete-me and the TTL cleanup all delete messages). Kept out of `public`,
-- so the Data API never serves vectors, and out of chat_message_history, so
-- LangChain reads that table unchanged.
create table memchat.message_embeddings (
  message_id bigint primary key references public.chat_message_history (id) on delete cascade,
  user_id uuid not null,
  session_id uuid not null,
  agent_name text not null,
  created_at timestamptz not null,
  -- The size must equal EMBEDDING_DIMENSIONS; the API checks it at start.
  -- To change it: truncate this table, then alter the column's type (recall
  -- starts over; stored messages stay).
  embedding extensions.vector(512) not null
);
comment on table memchat.message_embeddings is
  'The embedding of each stored user message, for recall. Goes with its message.';
-- pgvector stores vectors out of line by default (EXTERNAL); a 512-float
-- vector is ~2 KB, just past the TOAST threshold, and a per-user scan would
-- then fetch each one from the TOAST table. MAIN keeps it in the row.
alter table memchat.message_embeddings alter column embedding set storage main;

-- Recall reads every embedding of one (user, agent) and ranks them exactly:
-- with RLS (or any per-user filter) an approximate index (HNSW) searches
-- everyone's vectors and filters afterwards, so it can return fewer than k
-- of the caller's own (pgvector 0.6 has no iterative scans). See
-- docs/benchmarks.md for both, measured.
create index message_embeddings_owner_idx
  on memchat.message_embeddings (user_id, agent_name);

alter table memchat.message_embeddings enable row level security;
revoke all on memchat.message_embeddings from public;
grant select, insert on memchat.message_embeddings to memchat_user;
create policy message_embeddings_select on memchat.message_embeddings
  for select to memchat_user using (user_id = (select auth.uid()));
create policy message_embeddings_insert on memchat.message_embeddings
  for insert to memchat_user with check (
    user_id = (select auth.uid())
    and exists (select 1 from public.chat_message_history h
                where h.id = message_id and h.user_id = (select auth.uid())
                  and h.session_id = message_embeddings.session_id));

-- -------------------------------------------------------------- recall
-- The caller's earlier user messages of one agent most similar to p_query
-- (p_session_id: the turn's session; null: the active one, if any),
-- best first, as [{message_id, session_id, created_at, score, title,
-- question, answer}]: in live sessions only (not expired; cleared ones have
-- no messages left), never the last p_window conversational messages of
-- p_session_id (they are in the prompt already), none below p_min_score,
-- and none at >= p_collapse similarity to a better hit (near-duplicates
-- collapse into the best one). `answer` is the session's next final
-- assistant message. Runs as the caller: RLS applies to every read.
create function memchat.recall(
  p_session_id uuid,
  p_agent_name text,
  p_window integer,
  p_query extensions.vector,
  p_k integer,
  p_min_score double precision,
  p_collapse double precision
) returns jsonb
language plpgsql stable
set search_path = ''
as $$
declare
  v_uid uuid := auth.uid();
  v_floor bigint;
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
      join public.chat_sessions s on s.id = a.active_session_id
     where a.user_id = v_uid and a.agent_name = p_agent_name
       and s.status = 'active' and s.expires_at > now();
  end if;
  if p_session_id is not null and p_window > 0 then
    select min(w.id) into v_floor
      from (select h.id from public.chat_message_history h
             where h.user_id = v_uid and h.session_id = p_session_id
               and h.message->>'type' <> 'tool'
               and coalesce(jsonb_array_length(h.message->'data'->'tool_calls'), 0) = 0
             order by h.id desc
             limit p_window) w;
  end if;

  -- A few times k candidates, so that collapsing still leaves k.
  for v_candidate in
    select e.message_id, e.embedding,
           1 - (e.embedding operator(extensions.<=>) p_query) as score
      from memchat.message_embeddings e
      join public.chat_sessions s on s.id = e.session_id
     where e.user_id = v_uid and e.agent_name = p_agent_name
       and s.status = 'active' and s.expires_at > now()
       and (p_session_id is null or e.session_id <> p_session_id
            or e.message_id < coalesce(v_floor, 9223372036854775807))
     order by e.embedding operator(extensions.<=>) p_query
     limit p_k * 4
  loop
    exit when v_candidate.score < p_min_score or cardinality(v_ids) >= p_k;
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
             'answer', left(a.message->'data'->>'content', 2000))
           order by hit.ord)
      from unnest(v_ids, v_scores) with ordinality as hit(id, score, ord)
      join public.chat_message_history h on h.id = hit.id
      join public.chat_sessions s on s.id = h.session_id
      left join lateral (
           select x.message from public.chat_message_history x
            where x.session_id = h.session_id and x.id > h.id
              and x.message->>'type' = 'ai'
              and coalesce(jsonb_array_length(x.message->'data'->'tool_calls'), 0) = 0
            order by x.id limit 1) a on true), '[]'::jsonb);
end
$$;

-- The stored column's size, for the API's start-up check.
create function memchat.embedding_dimensions() returns integer
language sql stable
set search_path = ''
as $$
  select a.atttypmod from pg_catalog.pg_attribute a
   where a.attrelid = 'memchat.message_embeddings'::regclass and a.attname = 'embedding'
$$;

-- ------------------------------------------- record_turn, with the embedding
drop function memchat.record_turn(uuid, text, text, jsonb, interval, text, text, integer, boolean);

-- Store a whole turn atomically and return the session as JSON. The session
-- row is locked first, so concurrent turns on one session queue up and each
-- turn's messages get consecutive ids. A turn on an expired session that
-- cleanup has not reached yet starts the conversation over.
-- p_new_session: the caller had no session and none was active; if another
-- turn made one active meanwhile (two first messages at once), this turn
-- joins it instead of starting a second conversation.
-- p_notes null: the notes were not changed; else saved with the version check
-- of memchat.save_notes (SQLSTATE MC409 on a concurrent change).
-- p_embedding: the user message's embedding (null when it could not be made).
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
  p_embedding extensions.vector
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
  v_first bigint;
begin
  if p_new_session then
    -- Serialises the first turns of one (user, agent); the lock ends with
    -- the transaction, so it is safe behind a transaction-mode pooler.
    perform pg_advisory_xact_lock(
      hashtextextended('memchat.new_session/' || v_uid::text || '/' || p_agent_name, 0));
    select s.id into v_active
      from public.user_agent_active_sessions a
      join public.chat_sessions s on s.id = a.active_session_id
     where a.user_id = v_uid and a.agent_name = p_agent_name
       and s.status = 'active' and s.expires_at > now();
    p_session_id := coalesce(v_active, p_session_id);
  end if;

  select s.expires_at <= now() into v_expired
    from public.chat_sessions s where s.id = p_session_id for update;
  if v_expired then
    delete from public.chat_message_history h where h.session_id = p_session_id;
  end if;

  insert into public.chat_sessions as s
      (id, user_id, agent_name, title, message_count, last_active_at, expires_at)
  values (p_session_id, v_uid, p_agent_name, p_title, v_count, now(),
          memchat.session_expiry(p_ttl))
  on conflict (id) do update set
      message_count = case when s.expires_at <= now() then excluded.message_count
                           else s.message_count + excluded.message_count end,
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
  select min(i.id) into v_first from inserted i;

  -- The first message of a turn is the user's.
  if p_embedding is not null then
    insert into memchat.message_embeddings
        (message_id, user_id, session_id, agent_name, created_at, embedding)
    values (v_first, v_uid, p_session_id, v_session.agent_name, now(), p_embedding);
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

  return to_jsonb(v_session);
end
$$;

revoke all on function
  memchat.recall(uuid, text, integer, extensions.vector, integer, double precision,
                 double precision),
  memchat.embedding_dimensions(),
  memchat.record_turn(uuid, text, text, jsonb, interval, text, text, integer, boolean,
                      extensions.vector)
  from public;
grant execute on function
  memchat.recall(uuid, text, integer, extensions.vector, integer, double precision,
                 double precision),
  memchat.embedding_dimensions(),
  memchat.record_turn(uuid, text, text, jsonb, interval, text, text, integer, boolean,
                      extensions.vector)
  to memchat_user;
