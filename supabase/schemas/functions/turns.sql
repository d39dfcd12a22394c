-- A chat turn's two round trips, as two functions: load_context before the
-- model is called, record_turn after. PL/pgSQL keeps each statement's plan
-- for the life of the server connection, which works behind a
-- transaction-mode pooler (no named prepared statements), and saves
-- re-planning the same statements on every turn. Both run as the caller
-- (security invoker): row-level security applies to every statement.
--
-- Their plans are generic (plan_cache_mode = force_generic_plan): they read
-- and write the caller's rows by key, where a plan made for each call's
-- values is no better than the connection's generic one (left to auto,
-- load_context's notes lookup was planned at every call where the user had
-- no notes; tests/store/test_plans.py counts the plans).

-- Resolve the session and read what a turn starts from, in one call:
-- {"idempotency": "conflict"}           the key was used with another message
-- {"idempotency": "in_flight"}          the same turn is being answered now
-- {"throttled": seconds}                out of chat tokens: retry after
-- {"taken": false, "session", "replay"} the stored answer of this key (the
--                                       ids of the stored messages with it)
-- {"taken": false, "session", "notes", "messages", "summary", "claimed",
--  "stored_messages", "limits"}
-- The session is the caller's own of p_session_id (another user's id is an
-- unknown id to this caller), else the active one of p_agent_name. With
-- p_client_message_id, the key is claimed for p_claim_seconds. The throttle
-- is memchat.rate_buckets' bucket 'chat'. The window reaches back to the
-- summary: the messages the summary does not cover yet stay in the window
-- (at most p_read_max of them), so a summary is usable between refreshes,
-- not only right after one; only when even p_read_max messages do not reach
-- it back (the worker is behind) is it left out, as a hole would make it
-- misleading. The caller's stored messages and the quota come with it, so
-- a turn past the quota is refused before the model is called.
-- Every read is a key lookup or the top N of one index range: when the
-- planner underestimates a session's size it may prefer a bitmap scan that
-- reads the whole session and sorts it; the ordered index scan is never
-- worse (enable_bitmapscan = off).
create function memchat.load_context(
  p_user_id uuid,
  p_session_id uuid, p_agent_name text, p_window integer, p_read_notes boolean,
  p_client_message_id text, p_message text, p_rate_per_minute double precision,
  p_rate_burst integer, p_claim_seconds double precision, p_read_max integer
)
returns jsonb
language plpgsql
set search_path = ''
set enable_bitmapscan = off
set plan_cache_mode = force_generic_plan
as $function$
declare
  -- now() itself in ON CONFLICT DO UPDATE: refused by Citus (docs/deploy.md).
  v_now timestamptz := now();
  v_uid uuid := auth.uid();
  v_session public.chat_sessions;
  v_session_json jsonb;
  v_notes jsonb;
  v_messages jsonb := '[]'::jsonb;
  v_summary jsonb;
  v_stored text;
  v_replay jsonb;
  v_same boolean;
  v_retry double precision;
  v_digest bytea;
  v_with_summary boolean;
  v_read integer;
  v_recent record;
  v_ids bigint[] := '{}';
  v_bodies jsonb[] := '{}';
  v_keep integer;
  v_limits jsonb;
begin
  -- The caller as the API names it: on Citus the call is delegated by it
  -- to the worker holding that user's shards (`memchat db distribute`).
  if p_user_id is distinct from v_uid then
    raise exception 'the caller is not user %', p_user_id using errcode = '42501';
  end if;
  if p_session_id is not null then
    select s.* into v_session from public.chat_sessions s
     where s.id = p_session_id and s.user_id = v_uid;
  else
    select s.* into v_session
      from public.user_agent_active_sessions a
      join public.chat_sessions s on s.id = a.active_session_id and s.user_id = a.user_id
     where a.user_id = v_uid and a.agent_name = p_agent_name
       and s.status = 'active' and s.expires_at > v_now;
  end if;
  if v_session.id is not null then
    v_session_json := to_jsonb(v_session)
      || jsonb_build_object('expired', v_session.expires_at <= v_now);
  end if;

  if p_client_message_id is not null then
    if v_session.id is not null then
      select u.message->'data'->>'content',
             case when a.id is not null then jsonb_build_object(
               'message', a.message, 'message_id', a.id, 'user_message_id', u.id) end
        into v_stored, v_replay
        from public.chat_message_history u
        left join lateral (
             select x.id, x.message from public.chat_message_history x
              where x.user_id = v_uid and x.session_id = u.session_id and x.id > u.id
                and x.message->>'type' = 'ai'
                and coalesce(jsonb_array_length(x.message->'data'->'tool_calls'), 0) = 0
              order by x.id limit 1) a on true
       where u.user_id = v_uid and u.session_id = v_session.id
         and u.client_message_id = p_client_message_id;
      if found then
        if v_stored is distinct from p_message then
          return jsonb_build_object('idempotency', 'conflict');
        end if;
        if v_replay is not null then
          return jsonb_build_object('taken', false, 'session', v_session_json,
                                    'replay', v_replay);
        end if;
      end if;
    end if;
    v_digest := sha256(convert_to(coalesce(p_message, ''), 'UTF8'));
    select c.message_digest = v_digest into v_same
      from memchat.turn_claims c
     where c.user_id = v_uid and c.client_message_id = p_client_message_id
       and c.expires_at > v_now;
    if found then
      return jsonb_build_object('idempotency', case when v_same then 'in_flight' else 'conflict' end);
    end if;
  end if;

  if p_rate_per_minute > 0 or p_client_message_id is not null then
    -- What this transaction writes (a throttle token, a turn claim) may be
    -- lost in a server crash without harm, so its commit does not wait for
    -- the WAL flush: the turn's first round trip stays a read's.
    perform set_config('synchronous_commit', 'off', true);
  end if;

  if p_rate_per_minute > 0 then
    v_retry := memchat.take_rate_token('chat', p_rate_per_minute, p_rate_burst);
    if v_retry > 0 then
      return jsonb_build_object('throttled', v_retry);
    end if;
  end if;

  if p_client_message_id is not null then
    insert into memchat.turn_claims as c (user_id, client_message_id, message_digest, expires_at)
    values (v_uid, p_client_message_id, v_digest,
            v_now + make_interval(secs => p_claim_seconds))
    on conflict (user_id, client_message_id) do update
       set message_digest = excluded.message_digest, expires_at = excluded.expires_at
     where c.expires_at <= v_now
    returning true into v_same;
    if v_same is null then
      -- A concurrent request claimed it first (its row was not yet visible).
      return jsonb_build_object('idempotency', 'in_flight');
    end if;
  end if;

  if p_read_notes then
    select jsonb_build_object('notes', m.notes, 'version', m.version, 'updated_at', m.updated_at)
      into v_notes
      from public.agent_long_term_memory m
     where m.user_id = v_uid and m.agent_name = coalesce(v_session.agent_name, p_agent_name);
  end if;

  if v_session.id is not null and v_session.expires_at > v_now then
    v_with_summary := v_session.summary is not null and p_read_notes;
    -- With a summary, one more than the most it may keep: the message the
    -- summary ends with, which shows that nothing lies between.
    v_read := case when v_with_summary then greatest(p_window, p_read_max) + 1 else p_window end;
    -- Walks chat_message_history_window_idx and stops after v_read entries.
    for v_recent in
      select h.id, h.message from public.chat_message_history h
       where h.user_id = v_uid and h.session_id = v_session.id
         and h.message->>'type' <> 'tool'
         and coalesce(jsonb_array_length(h.message->'data'->'tool_calls'), 0) = 0
       order by h.id desc
       limit v_read
    loop
      v_ids := v_ids || v_recent.id;
      v_bodies := v_bodies || v_recent.message;
    end loop;
    v_keep := least(p_window, cardinality(v_ids));
    -- The summary is usable when what was read reaches back to it (or is
    -- the whole session): then every message after it is in the window.
    if v_with_summary and (cardinality(v_ids) < v_read
                           or v_ids[cardinality(v_ids)] <= v_session.summary_covers_until) then
      while v_keep < cardinality(v_ids) and v_ids[v_keep + 1] > v_session.summary_covers_until loop
        v_keep := v_keep + 1;
      end loop;
      v_summary := jsonb_build_object(
        'text', v_session.summary,
        'covers_until', v_session.summary_covers_until,
        'updated_at', v_session.summary_updated_at);
    end if;
    select coalesce(jsonb_agg(b.body order by b.ord desc), '[]'::jsonb) into v_messages
      from unnest(v_bodies[1:v_keep]) with ordinality as b(body, ord);
  end if;

  select jsonb_build_object(
           'max_message_chars', l.max_message_chars,
           'max_notes_chars', l.max_notes_chars,
           'max_session_ttl_seconds', extract(epoch from l.max_session_ttl))
    into v_limits
    from memchat.limits l;
  return jsonb_build_object(
    'taken', false,
    'session', v_session_json,
    'notes', v_notes,
    'messages', v_messages,
    'summary', v_summary,
    'replay', null,
    'claimed', p_client_message_id is not null,
    'stored_messages', memchat.stored_messages(),
    'limits', v_limits || jsonb_build_object('max_stored_messages',
                                             memchat.max_stored_messages()));
end
$function$;

-- Store a whole turn atomically and return the session as JSON, with the
-- ids of the messages it stored (`message_ids`: the user's first, the
-- answer last). The session row is locked first, so concurrent turns on one
-- session queue up and each turn's messages get consecutive ids. A turn on
-- an expired session that cleanup has not reached yet starts the
-- conversation over (its messages and summary go). Also:
-- * p_new_session: the caller had no session and none was active; if
--   another turn made one active meanwhile (two first messages at once),
--   this turn joins it instead of starting a second conversation.
-- * p_notes null: the notes were not changed; else saved with the version
--   check of memchat.save_notes (SQLSTATE MC409 on a concurrent change).
-- * p_embedding: the user message's embedding, made by p_embedding_model
--   (null when it could not be made: the backfill does it later).
-- * p_due_after: a session with that many messages or more outside its
--   summary is queued for the summary worker (a given-up one is retried).
-- * The session's turn and token counters, from the usage the assistant
--   messages carry; the quota (memchat.hold_stored_messages).
create function memchat.record_turn(
  p_user_id uuid,
  p_session_id uuid, p_agent_name text, p_title text, p_messages jsonb, p_ttl interval,
  p_client_message_id text, p_notes text, p_notes_version integer, p_new_session boolean,
  p_embedding extensions.vector, p_embedding_model text, p_due_after integer
)
returns jsonb
language plpgsql
set search_path = ''
set plan_cache_mode = force_generic_plan
as $function$
declare
  -- now() itself in ON CONFLICT DO UPDATE: refused by Citus (docs/deploy.md).
  v_now timestamptz := now();
  v_uid uuid := auth.uid();
  v_count integer := jsonb_array_length(p_messages);
  v_session public.chat_sessions;
  v_expired boolean;
  v_active uuid;
  v_ids bigint[];
  v_prompt bigint;
  v_completion bigint;
  v_message jsonb;
  v_ord bigint;
  v_id bigint;
  v_max_chars integer;
begin
  -- The caller as the API names it: on Citus the call is delegated by it
  -- to the worker holding that user's shards (`memchat db distribute`).
  if p_user_id is distinct from v_uid then
    raise exception 'the caller is not user %', p_user_id using errcode = '42501';
  end if;
  -- A new turn's user message is held to max_message_chars (what may be
  -- sent to the model); the messages' trigger holds every stored one only to
  -- the larger bound an imported message has.
  select l.max_message_chars into v_max_chars from memchat.limits l;
  if exists (select 1 from jsonb_array_elements(p_messages) m
              where m->>'type' = 'human' and char_length(m->'data'->>'content') > v_max_chars) then
    raise exception 'message is over % characters', v_max_chars using errcode = 'MC413';
  end if;
  perform memchat.hold_stored_messages(v_count);

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
       and s.status = 'active' and s.expires_at > v_now;
    p_session_id := coalesce(v_active, p_session_id);
  end if;

  select s.expires_at <= v_now into v_expired
    from public.chat_sessions s where s.id = p_session_id and s.user_id = v_uid for update;
  if v_expired then
    delete from public.chat_message_history h
     where h.user_id = v_uid and h.session_id = p_session_id;
  end if;

  insert into public.chat_sessions as s
      (id, user_id, agent_name, title, message_count, last_active_at, expires_at,
       turn_count, prompt_tokens, completion_tokens)
  values (p_session_id, v_uid, p_agent_name, p_title, v_count, v_now,
          memchat.session_expiry(p_ttl), 1, v_prompt, v_completion)
  on conflict (id, user_id) do update set
      message_count = case when s.expires_at <= v_now then excluded.message_count
                           else s.message_count + excluded.message_count end,
      turn_count = case when s.expires_at <= v_now then 1 else s.turn_count + 1 end,
      prompt_tokens = case when s.expires_at <= v_now then excluded.prompt_tokens
                           else s.prompt_tokens + excluded.prompt_tokens end,
      completion_tokens = case when s.expires_at <= v_now then excluded.completion_tokens
                               else s.completion_tokens + excluded.completion_tokens end,
      summary = case when s.expires_at <= v_now then null else s.summary end,
      summary_covers_until =
        case when s.expires_at <= v_now then null else s.summary_covers_until end,
      summary_covers_count =
        case when s.expires_at <= v_now then 0 else s.summary_covers_count end,
      summary_updated_at =
        case when s.expires_at <= v_now then null else s.summary_updated_at end,
      title = coalesce(s.title, excluded.title),
      status = 'active',
      last_active_at = excluded.last_active_at,
      expires_at = excluded.expires_at
  returning s.* into v_session;

  -- A row per statement: a turn's few messages, each an insert Citus routes
  -- to the shard by its values alone (an INSERT ... SELECT would be
  -- planned as one across shards, its rows passed through a file).
  for v_message, v_ord in
    select m.message, m.ord
      from jsonb_array_elements(p_messages) with ordinality as m(message, ord)
     order by m.ord
  loop
    insert into public.chat_message_history (session_id, user_id, message, client_message_id)
    values (p_session_id, v_uid, v_message, case when v_ord = 1 then p_client_message_id end)
    returning id into v_id;
    v_ids := v_ids || v_id;
  end loop;

  -- The first message of a turn is the user's.
  if p_embedding is not null then
    insert into memchat.message_embeddings
        (message_id, user_id, session_id, agent_name, created_at, model, embedding)
    values (v_ids[1], v_uid, p_session_id, v_session.agent_name, v_now, p_embedding_model,
            p_embedding);
  end if;

  insert into public.user_agent_active_sessions as a
      (user_id, agent_name, active_session_id, last_active_at)
  values (v_uid, v_session.agent_name, p_session_id, v_now)
  on conflict (user_id, agent_name) do update set
      active_session_id = excluded.active_session_id,
      last_active_at = excluded.last_active_at;

  if p_notes is not null then
    perform memchat.save_notes(v_uid, v_session.agent_name, p_notes, p_notes_version);
  end if;

  if p_client_message_id is not null then
    delete from memchat.turn_claims c
     where c.user_id = v_uid and c.client_message_id = p_client_message_id;
  end if;

  if p_due_after is not null
     and v_session.message_count - v_session.summary_covers_count >= p_due_after then
    insert into memchat.summary_queue as q (session_id, user_id)
    values (p_session_id, v_uid)
    on conflict (session_id, user_id) do update set attempts = 0, next_attempt_at = v_now
     where q.next_attempt_at = 'infinity';
  end if;

  -- The ids of the turn's messages, in order: the user's first, the answer last.
  return to_jsonb(v_session) || jsonb_build_object('message_ids', to_jsonb(v_ids));
end
$function$;

-- Fills user_id from the session when an insert leaves it out (LangChain's
-- add_messages does): the caller's own session of that id. Runs as the
-- inserting role, so row-level security still applies.
create function memchat.fill_message_user_id() returns trigger
language plpgsql
set search_path = ''
as $$
begin
  if new.user_id is null then
    select s.user_id into new.user_id from public.chat_sessions s
     where s.id = new.session_id
     order by s.user_id = (select auth.uid()) desc nulls last
     limit 1;
  end if;
  return new;
end
$$;

-- Which session a chat front end's resent history belongs to, and that
-- history as memchat stored it (POST /v1/chat/completions without a session
-- or chat id; docs/api.md, "Which session"). A Chat Completions client
-- resends its whole chat on every call; memchat recognises the chat by the
-- answers it stored: the session that holds the client's last answer
-- (after the same question) is the chat's, and the window sent to the model
-- is the client's earlier exchanges as memchat stored them (each answer
-- found by its text, after the same question, in that session), never the
-- client's copy and never another chat's messages that happen to share the
-- session. An answer is found by the digest of its trimmed text, through
-- chat_message_history_answer_idx (tables/messages.sql).
-- p_questions, p_answers: the client's exchanges, oldest first (a question
-- may be null: an answer with no user message before it). Returns
-- {"session_id": the session holding the last answer after its question,
-- the newest such among the caller's live sessions of p_agent_name, or
-- null; "messages": that session's stored question and answer of each of
-- the last p_limit exchanges found in it, oldest first (LangChain's shape)}.
create function memchat.chat_of_history(
  p_agent_name text, p_questions text[], p_answers text[], p_limit integer
) returns jsonb
language plpgsql stable
set search_path = ''
as $$
declare
  v_uid uuid := auth.uid();
  v_last integer := cardinality(p_answers);
  v_session uuid;
  v_messages jsonb;
begin
  if v_last is null or v_last = 0 then
    return jsonb_build_object('session_id', null, 'messages', '[]'::jsonb);
  end if;
  select h.session_id into v_session
    from public.chat_message_history h
    join public.chat_sessions s on s.id = h.session_id and s.user_id = h.user_id
   where h.user_id = v_uid
     and decode(md5(btrim(h.message->'data'->>'content', E' \t\r\n')), 'hex')
         = decode(md5(btrim(p_answers[v_last], E' \t\r\n')), 'hex')
     and h.message->>'type' = 'ai'
     and coalesce(jsonb_array_length(h.message->'data'->'tool_calls'), 0) = 0
     and s.agent_name = p_agent_name and s.status = 'active' and s.expires_at > now()
     and (select q.message->'data'->>'content' from public.chat_message_history q
           where q.user_id = v_uid and q.session_id = h.session_id and q.id < h.id
             and q.message->>'type' = 'human'
           order by q.id desc limit 1) is not distinct from btrim(p_questions[v_last], E' \t\r\n')
   order by h.id desc
   limit 1;
  if v_session is null then
    return jsonb_build_object('session_id', null, 'messages', '[]'::jsonb);
  end if;

  -- Each exchange once: its answer's newest stored copy in the session.
  with given as (
    select g.question, decode(md5(btrim(g.answer, E' \t\r\n')), 'hex') as digest, g.ord
      from unnest(p_questions, p_answers) with ordinality as g(question, answer, ord)
     order by g.ord desc
     limit p_limit
  ), found as (
    select distinct on (a.id) a.id, a.message as answer, q.message as question, g.ord
      from given g
      join lateral (
        select h.id, h.message from public.chat_message_history h
         where h.user_id = v_uid and h.session_id = v_session
           and decode(md5(btrim(h.message->'data'->>'content', E' \t\r\n')), 'hex') = g.digest
           and h.message->>'type' = 'ai'
           and coalesce(jsonb_array_length(h.message->'data'->'tool_calls'), 0) = 0
         order by h.id desc
         limit 1) a on true
      left join lateral (
        select x.message from public.chat_message_history x
         where x.user_id = v_uid and x.session_id = v_session and x.id < a.id
           and x.message->>'type' = 'human'
         order by x.id desc
         limit 1) q on true
     where btrim(q.message->'data'->>'content', E' \t\r\n')
           is not distinct from btrim(g.question, E' \t\r\n')
     order by a.id, g.ord
  )
  select coalesce(jsonb_agg(m.message order by f.id, m.part), '[]'::jsonb) into v_messages
    from found f
    cross join lateral (values (1, f.question), (2, f.answer)) as m(part, message)
   where m.message is not null;
  return jsonb_build_object('session_id', v_session, 'messages', v_messages);
end
$$;

-- The session a clear-session request names (memchat.store.sessions): the
-- given id, else the caller's active one of p_agent_name, locked, and its
-- id and agent recorded for the transaction (memchat.clear_target,
-- memchat.clear_agent), so the request's later statements act on that
-- session even if the active pointer moves meanwhile. Null: the caller has
-- no such session. A function, so that the settings are made where the
-- transaction runs (on Citus the coordinator, not the shard's worker, which
-- runs the lookup).
create function memchat.lock_clear_target(p_session_id uuid, p_agent_name text)
returns uuid
language plpgsql
set search_path = ''
as $$
declare
  v_uid uuid := auth.uid();
  v_id uuid;
  v_agent text;
begin
  select s.id, s.agent_name into v_id, v_agent
    from public.chat_sessions s
   where s.user_id = v_uid
     and s.id = coalesce(p_session_id,
         (select a.active_session_id from public.user_agent_active_sessions a
           where a.user_id = v_uid and a.agent_name = p_agent_name))
     for update;
  perform pg_catalog.set_config('memchat.clear_target', coalesce(v_id::text, ''), true);
  perform pg_catalog.set_config('memchat.clear_agent', coalesce(v_agent, ''), true);
  return v_id;
end
$$;
