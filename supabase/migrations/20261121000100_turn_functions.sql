-- A chat turn's two round trips as two functions. PL/pgSQL keeps each
-- statement's plan for the life of the server connection, which works
-- behind a transaction-mode pooler (no named prepared statements), and saves
-- re-planning the same statements on every turn. Both run as the caller
-- (security invoker): row-level security applies to every statement.

-- Resolve the session and read what a turn starts from:
-- {"taken": bool, "session": {...} | null, "notes": {...} | null,
--  "messages": [last p_window conversational messages, oldest first],
--  "replay": the stored answer for p_client_message_id | null}
create function memchat.load_context(
  p_session_id uuid,
  p_agent_name text,
  p_window integer,
  p_read_notes boolean,
  p_client_message_id text
) returns jsonb
language plpgsql stable
set search_path = ''
-- Every read here is a key lookup or the top N of one index range. When the
-- planner underestimates a session's size it may prefer a bitmap scan that
-- reads the whole session and sorts it; the ordered index scan is never worse.
set enable_bitmapscan = off
as $$
declare
  v_uid uuid := auth.uid();
  v_session public.chat_sessions;
  v_notes jsonb;
  v_messages jsonb := '[]'::jsonb;
  v_replay jsonb;
begin
  if p_session_id is not null then
    select s.* into v_session from public.chat_sessions s where s.id = p_session_id;
    if v_session.id is null and memchat.session_id_taken(p_session_id) then
      return jsonb_build_object('taken', true);
    end if;
  else
    select s.* into v_session
      from public.user_agent_active_sessions a
      join public.chat_sessions s on s.id = a.active_session_id
     where a.user_id = v_uid and a.agent_name = p_agent_name
       and s.status = 'active' and s.expires_at > now();
  end if;

  if p_read_notes then
    select jsonb_build_object('notes', m.notes, 'version', m.version, 'updated_at', m.updated_at)
      into v_notes
      from public.agent_long_term_memory m
     where m.user_id = v_uid and m.agent_name = coalesce(v_session.agent_name, p_agent_name);
  end if;

  if v_session.id is not null and v_session.expires_at > now() then
    -- Walks chat_message_history_window_idx and stops after p_window entries.
    select coalesce(jsonb_agg(w.message order by w.id), '[]'::jsonb) into v_messages
      from (select h.id, h.message from public.chat_message_history h
             where h.user_id = v_uid and h.session_id = v_session.id
               and h.message->>'type' <> 'tool'
               and coalesce(jsonb_array_length(h.message->'data'->'tool_calls'), 0) = 0
             order by h.id desc
             limit p_window) w;
  end if;

  if p_client_message_id is not null and v_session.id is not null then
    select a.message into v_replay
      from public.chat_message_history u
      cross join lateral (
           select x.message from public.chat_message_history x
            where x.session_id = u.session_id and x.id > u.id
              and x.message->>'type' = 'ai'
              and coalesce(jsonb_array_length(x.message->'data'->'tool_calls'), 0) = 0
            order by x.id limit 1) a
     where u.session_id = v_session.id and u.client_message_id = p_client_message_id;
  end if;

  return jsonb_build_object(
    'taken', false,
    'session', case when v_session.id is null then null else
      to_jsonb(v_session) || jsonb_build_object('expired', v_session.expires_at <= now()) end,
    'notes', v_notes,
    'messages', v_messages,
    'replay', v_replay);
end
$$;

-- Store a whole turn atomically and return the session as JSON. The session
-- row is locked first, so concurrent turns on one session queue up and each
-- turn's messages get consecutive ids. A turn on an expired session that
-- cleanup has not reached yet starts the conversation over.
-- p_notes null: the notes were not changed; else saved with the version check
-- of memchat.save_notes (SQLSTATE MC409 on a concurrent change).
create function memchat.record_turn(
  p_session_id uuid,
  p_agent_name text,
  p_title text,
  p_messages jsonb,
  p_ttl interval,
  p_client_message_id text,
  p_notes text,
  p_notes_version integer
) returns jsonb
language plpgsql
set search_path = ''
as $$
declare
  v_uid uuid := auth.uid();
  v_count integer := jsonb_array_length(p_messages);
  v_session public.chat_sessions;
  v_expired boolean;
begin
  select s.expires_at <= now() into v_expired
    from public.chat_sessions s where s.id = p_session_id for update;
  if v_expired then
    delete from public.chat_message_history h where h.session_id = p_session_id;
  end if;

  insert into public.chat_sessions as s
      (id, user_id, agent_name, title, message_count, last_active_at, expires_at)
  values (p_session_id, v_uid, p_agent_name, p_title, v_count, now(), now() + p_ttl)
  on conflict (id) do update set
      message_count = case when s.expires_at <= now() then excluded.message_count
                           else s.message_count + excluded.message_count end,
      title = coalesce(s.title, excluded.title),
      status = 'active',
      last_active_at = excluded.last_active_at,
      expires_at = excluded.expires_at
  returning s.* into v_session;

  insert into public.chat_message_history (session_id, user_id, message, client_message_id)
  select p_session_id, v_uid, m.message, case when m.ord = 1 then p_client_message_id end
    from jsonb_array_elements(p_messages) with ordinality as m(message, ord)
   order by m.ord;

  insert into public.user_agent_active_sessions as a
      (user_id, agent_name, active_session_id, last_active_at)
  values (v_uid, v_session.agent_name, p_session_id, now())
  on conflict (user_id, agent_name) do update set
      active_session_id = excluded.active_session_id,
      last_active_at = excluded.last_active_at;

  if p_notes is not null then
    perform memchat.save_notes(v_session.agent_name, p_notes, p_notes_version);
  end if;

  return to_jsonb(v_session);
end
$$;

revoke all on function
  memchat.load_context(uuid, text, integer, boolean, text),
  memchat.record_turn(uuid, text, text, jsonb, interval, text, text, integer)
  from public;
grant execute on function
  memchat.load_context(uuid, text, integer, boolean, text),
  memchat.record_turn(uuid, text, text, jsonb, interval, text, text, integer)
  to authenticated, service_role;
