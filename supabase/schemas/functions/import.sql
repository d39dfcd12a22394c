-- History import: conversations from a file, with their original
-- timestamps (POST /sessions/import, `memchat import`).
--
-- memchat.import_sessions stores one batch of imported sessions in one call:
-- the sessions, their messages in order, the feedback on their answers, their
-- rolling summaries, and notes for agents the caller has none for. It runs as
-- the caller (security invoker), so row-level security, memchat.limits and
-- the tables' triggers hold exactly as for a chat turn.
--
-- Idempotent: an imported session's key is its id, unique per user by the
-- primary key (id, user_id). The API gives it the id the file names or, when
-- the file names none, one derived from its content (memchat.usecases.
-- history_import), so a session the caller already has, from an earlier
-- import or any other way, is skipped with all its messages, and importing a
-- file twice stores nothing twice. The caller's expired sessions with the
-- ids given are deleted first (with their messages and what depends on
-- them), so they are imported, not skipped. Notes are never written over:
-- an agent the caller already has notes for keeps them.
--
-- Imported sessions are ordinary sessions: they expire p_ttl from the import,
-- whatever their dates (their created_at and last_active_at are the file's),
-- their counters (messages, turns, tokens) are those a turn would have kept,
-- and the cleanup, clear-session and DELETE /me treat them as any other.
-- The quota (memchat.hold_stored_messages) holds: with p_request
-- ([{"id", "messages"}]: every session of the whole request, the first
-- transaction's call) for the request's messages in sessions the caller
-- does not have live, and every call for what it stores itself.
--
-- p_user_id: the caller, as the API names it (on Citus, the worker the
--   call is delegated to).
-- p_sessions: [{"id", "agent_name", "title", "status", "created_at",
--   "last_active_at", "summary", "summary_covers" (the ordinal, from 1, of the
--   last message the summary covers), "summary_updated_at", "messages":
--   [{"message" (LangChain's shape), "created_at", "client_message_id"}]}],
--   each id once.
-- p_feedback: [{"session_id", "ordinal" (of the rated message, from 1),
--   "rating", "comment", "created_at", "updated_at"}].
-- p_notes: [{"agent_name", "notes", "created_at", "updated_at"}].
-- Returns {"sessions": [ids stored], "notes": [agent names stored]}: what is
-- not in them the caller had already.
create function memchat.import_sessions(
  p_user_id uuid, p_sessions jsonb, p_feedback jsonb, p_notes jsonb, p_ttl interval,
  p_request jsonb
) returns jsonb
language plpgsql
set search_path = ''
as $$
declare
  v_uid uuid := auth.uid();
  v_stored uuid[];
  v_ids bigint[];
  v_owners uuid[];
  v_notes text[];
begin
  -- The caller as the API names it: on Citus the call is delegated by it
  -- to the worker holding that user's shards (`memchat db distribute`).
  if p_user_id is distinct from v_uid then
    raise exception 'the caller is not user %', p_user_id using errcode = '42501';
  end if;
  delete from public.chat_sessions s
   using jsonb_to_recordset(p_sessions) as g(id uuid)
   where s.id = g.id and s.user_id = v_uid and s.expires_at <= now();

  if p_request is not null then
    perform memchat.hold_stored_messages(
      (select coalesce(sum(r.messages), 0)::bigint
         from jsonb_to_recordset(p_request) as r(id uuid, messages bigint)
        where not exists (select 1 from public.chat_sessions s
                           where s.id = r.id and s.user_id = v_uid and s.expires_at > now())));
  else
    perform memchat.hold_stored_messages(
      (select coalesce(sum(jsonb_array_length(g.messages)), 0)::bigint
         from jsonb_to_recordset(p_sessions) as g(id uuid, messages jsonb)
        where not exists (select 1 from public.chat_sessions s
                           where s.id = g.id and s.user_id = v_uid)));
  end if;

  -- Counters as record_turn keeps them: a turn per user message, the tokens
  -- the answers' usage carries.
  with given as (
    select g.* from jsonb_to_recordset(p_sessions) as g(
      id uuid, agent_name text, title text, status text,
      created_at timestamptz, last_active_at timestamptz, messages jsonb)
  ), inserted as (
    insert into public.chat_sessions as s
        (id, user_id, agent_name, title, status, message_count, created_at, last_active_at,
         expires_at, turn_count, prompt_tokens, completion_tokens)
    select g.id, v_uid, g.agent_name, g.title, g.status, jsonb_array_length(g.messages),
           g.created_at, g.last_active_at, memchat.session_expiry(p_ttl),
           c.turns, c.prompt, c.completion
      from given g
      cross join lateral (
        select count(*) filter (where m.item->'message'->>'type' = 'human') as turns,
               coalesce(sum((m.item->'message'->'data'->'usage_metadata'->>'input_tokens')::bigint)
                          filter (where m.item->'message'->>'type' = 'ai'), 0) as prompt,
               coalesce(sum((m.item->'message'->'data'->'usage_metadata'->>'output_tokens')::bigint)
                          filter (where m.item->'message'->>'type' = 'ai'), 0) as completion
          from jsonb_array_elements(g.messages) as m(item)) c
    on conflict (id, user_id) do nothing
    returning s.id)
  select coalesce(array_agg(i.id), '{}') into v_stored from inserted i;

  -- One statement per batch, its rows in the file's order, so each session's
  -- messages get ascending ids in that order (as a turn's do).
  with inserted as (
    insert into public.chat_message_history
        (session_id, user_id, message, client_message_id, created_at)
    select g.id, v_uid, m.item->'message', m.item->>'client_message_id',
           (m.item->>'created_at')::timestamptz
      from jsonb_to_recordset(p_sessions) as g(id uuid, messages jsonb)
      cross join lateral jsonb_array_elements(g.messages) with ordinality as m(item, ord)
     where g.id = any(v_stored)
     order by g.id, m.ord
    returning id, session_id)
  select coalesce(array_agg(i.id order by i.id), '{}'), coalesce(array_agg(i.session_id order by i.id), '{}')
    into v_ids, v_owners
    from inserted i;

  -- What refers to a message by its place in its session: feedback on an
  -- answer, the last message a summary covers. A statement of its own, after
  -- the messages, as the feedback's row-level security checks its message.
  with numbered as (
    select n.id, n.session_id,
           row_number() over (partition by n.session_id order by n.id) as ordinal
      from unnest(v_ids, v_owners) as n(id, session_id)
  )
  insert into memchat.message_feedback
      (message_id, user_id, session_id, agent_name, rating, comment, created_at, updated_at)
  select n.id, v_uid, n.session_id, s.agent_name, f.rating, f.comment,
         coalesce(f.created_at, now()), coalesce(f.updated_at, f.created_at, now())
    from jsonb_to_recordset(p_feedback) as f(
           session_id uuid, ordinal bigint, rating smallint, comment text,
           created_at timestamptz, updated_at timestamptz)
    join numbered n on n.session_id = f.session_id and n.ordinal = f.ordinal
    join public.chat_sessions s on s.id = n.session_id and s.user_id = v_uid;

  with numbered as (
    select n.id, n.session_id,
           row_number() over (partition by n.session_id order by n.id) as ordinal
      from unnest(v_ids, v_owners) as n(id, session_id)
  )
  update public.chat_sessions s
     set summary = g.summary, summary_covers_until = n.id,
         summary_covers_count = g.summary_covers, summary_updated_at = g.summary_updated_at
    from jsonb_to_recordset(p_sessions) as g(
           id uuid, summary text, summary_covers integer, summary_updated_at timestamptz)
    join numbered n on n.session_id = g.id and n.ordinal = g.summary_covers
   where s.id = g.id and s.user_id = v_uid and g.summary is not null;

  with inserted as (
    insert into public.agent_long_term_memory as m
        (user_id, agent_name, notes, created_at, updated_at)
    select v_uid, n.agent_name, n.notes, coalesce(n.created_at, now()),
           coalesce(n.updated_at, n.created_at, now())
      from jsonb_to_recordset(p_notes) as n(
             agent_name text, notes text, created_at timestamptz, updated_at timestamptz)
    on conflict (user_id, agent_name) do nothing
    returning m.agent_name)
  select coalesce(array_agg(i.agent_name), '{}') into v_notes from inserted i;

  return jsonb_build_object('sessions', to_jsonb(v_stored), 'notes', to_jsonb(v_notes));
end
$$;
