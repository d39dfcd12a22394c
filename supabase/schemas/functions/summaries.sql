-- Rolling summaries: each long session keeps a summary of the messages that
-- left its window (chat_sessions.summary*), refreshed by the summary worker,
-- never in a turn. A turn queues its session (memchat.summary_queue,
-- tables/queues.sql; memchat.record_turn) once enough messages beyond the
-- window are outside the summary, in the turn's transaction.
--
-- The worker logs in as `memchat_worker` and is no member of
-- `memchat_user`: it may call these functions and nothing else. They are
-- SECURITY DEFINER and act only on what a live lease holds: the queue item
-- the worker claimed, that session, its owner's rows.

-- Lease up to p_limit due items for p_lease_seconds (FOR UPDATE SKIP LOCKED:
-- another worker skips them): [{"lease", "session_id", "attempts"}]. The
-- owner's id stays in the database.
create function memchat.summary_claim(p_limit integer, p_lease_seconds double precision)
returns jsonb
language plpgsql
security definer
set search_path = ''
as $$
declare
  v_leased jsonb;
begin
  with due as (
    select d.session_id, d.user_id from memchat.summary_queue d
     where d.next_attempt_at <= now()
     order by d.next_attempt_at
     limit p_limit
       for update skip locked
  ), leased as (
    update memchat.summary_queue q
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

-- Seconds the oldest due item has been waiting (null: none is due).
create function memchat.summary_lag() returns double precision
language plpgsql stable
security definer
set search_path = ''
as $$
begin
  return (select extract(epoch from now() - min(q.due_since))::double precision
            from memchat.summary_queue q where q.next_attempt_at <> 'infinity');
end
$$;

-- The queue item a live lease holds (null: expired, taken over, or never).
create function memchat.summary_leased(p_lease uuid) returns memchat.summary_queue
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

-- What one refresh of a leased item summarizes: its summary so far and the
-- conversational messages after it that have left the window of p_window
-- (at most p_chunk, oldest first), as {"summary", "covers_until",
-- "messages": [{"id", "type", "content"}], "boundary"}; null when there is
-- nothing (left) to summarize or the lease is not live. Only that session,
-- only its owner's rows.
create function memchat.summary_source(p_lease uuid, p_window integer, p_chunk integer)
returns jsonb
language plpgsql stable
security definer
set search_path = ''
as $$
declare
  v_item memchat.summary_queue := memchat.summary_leased(p_lease);
  v_session public.chat_sessions;
  v_floor bigint;
  v_messages jsonb;
  v_last bigint;
begin
  if v_item.session_id is null then
    return null;
  end if;
  select s.* into v_session from public.chat_sessions s
   where s.id = v_item.session_id and s.user_id = v_item.user_id
     and s.status = 'active' and s.expires_at > now();
  if v_session.id is null then
    return null;
  end if;
  -- The window's oldest message: only what is older has left the window.
  select min(w.id) into v_floor
    from (select h.id from public.chat_message_history h
           where h.user_id = v_item.user_id and h.session_id = v_item.session_id
             and h.message->>'type' <> 'tool'
             and coalesce(jsonb_array_length(h.message->'data'->'tool_calls'), 0) = 0
           order by h.id desc
           limit p_window) w;
  select coalesce(jsonb_agg(jsonb_build_object(
           'id', m.id, 'type', m.message->>'type',
           'content', left(m.message->'data'->>'content', 4000)) order by m.id), '[]'::jsonb),
         max(m.id)
    into v_messages, v_last
    from (select h.id, h.message from public.chat_message_history h
           where h.user_id = v_item.user_id and h.session_id = v_item.session_id
             and h.id > coalesce(v_session.summary_covers_until, 0)
             and h.id < coalesce(v_floor, 0)
             and h.message->>'type' <> 'tool'
             and coalesce(jsonb_array_length(h.message->'data'->'tool_calls'), 0) = 0
           order by h.id
           limit p_chunk) m;
  if v_last is null then
    return null;
  end if;
  return jsonb_build_object(
    'summary', v_session.summary,
    'covers_until', v_session.summary_covers_until,
    'messages', v_messages,
    'boundary', v_last);
end
$$;

-- Store a refreshed summary of a leased item covering messages up to
-- p_covers_until, if the session still has the summary it was made from
-- (p_expected: its covers_until then) and still holds that message (a clear
-- in between deleted it). The item stays leased. Returns whether it was stored.
create function memchat.summary_save(
  p_lease uuid, p_summary text, p_covers_until bigint, p_expected bigint
) returns boolean
language plpgsql
security definer
set search_path = ''
as $$
declare
  v_item memchat.summary_queue := memchat.summary_leased(p_lease);
  v_newly integer;
  v_stored uuid;
begin
  if v_item.session_id is null then
    return false;
  end if;
  select count(*) into v_newly from public.chat_message_history h
   where h.user_id = v_item.user_id and h.session_id = v_item.session_id
     and h.id > coalesce(p_expected, 0) and h.id <= p_covers_until;
  update public.chat_sessions s
     set summary = p_summary,
         summary_covers_until = p_covers_until,
         summary_covers_count = s.summary_covers_count + v_newly,
         summary_updated_at = now()
   where s.id = v_item.session_id and s.user_id = v_item.user_id and s.status = 'active'
     and s.summary_covers_until is not distinct from p_expected
     and exists (select 1 from public.chat_message_history h
                  where h.user_id = v_item.user_id and h.session_id = v_item.session_id
                    and h.id = p_covers_until)
  returning s.id into v_stored;
  return v_stored is not null;
end
$$;

-- A leased item's summary kept as a durable memory (kind summary,
-- tables/memories.sql): p_summary, if it is still the session's summary,
-- with its embedding of p_model (pgvector's text form; null: it could not
-- be embedded, found by words only), dated by the last message it covers;
-- it replaces the session's earlier one. One its user forgot is not written
-- again (a later summary is). Returns whether it was stored.
create function memchat.summary_remember(
  p_lease uuid, p_summary text, p_model text, p_embedding text
) returns boolean
language plpgsql
security definer
set search_path = ''
as $$
declare
  v_item memchat.summary_queue := memchat.summary_leased(p_lease);
  v_session public.chat_sessions;
  v_at timestamptz;
  v_stored integer;
begin
  if v_item.session_id is null then
    return false;
  end if;
  select s.* into v_session from public.chat_sessions s
   where s.id = v_item.session_id and s.user_id = v_item.user_id
     and s.summary is not distinct from p_summary;
  select h.created_at into v_at from public.chat_message_history h
   where h.id = v_session.summary_covers_until and h.user_id = v_item.user_id;
  if v_session.id is null or v_at is null
     or exists (select 1 from memchat.forgotten_memories f
                 where f.message_id = v_session.summary_covers_until and f.ordinal = -1
                   and f.user_id = v_item.user_id) then
    return false;
  end if;
  delete from memchat.memories m
   where m.user_id = v_item.user_id and m.session_id = v_item.session_id
     and m.kind = 'summary';
  insert into memchat.memories
      (user_id, agent_name, kind, text, session_id, message_id, ordinal, created_at, model,
       embedding)
  values (v_item.user_id, v_session.agent_name, 'summary', left(p_summary, 4000),
          v_session.id, v_session.summary_covers_until, -1, v_at,
          case when p_embedding is not null then p_model end,
          p_embedding::extensions.vector);
  get diagnostics v_stored = row_count;
  return v_stored = 1;
end
$$;

-- The end of a leased item's pass: it stays queued (ready now, attempts
-- reset) while p_due_after or more of its messages are outside its summary
-- (new turns meanwhile), else it leaves the queue.
create function memchat.summary_done(p_lease uuid, p_due_after integer) returns void
language plpgsql
security definer
set search_path = ''
as $$
declare
  v_item memchat.summary_queue := memchat.summary_leased(p_lease);
begin
  if v_item.session_id is null then
    return;
  end if;
  if exists (
       select 1 from public.chat_sessions s
        where s.id = v_item.session_id and s.user_id = v_item.user_id and s.status = 'active'
          and s.message_count - s.summary_covers_count >= p_due_after) then
    update memchat.summary_queue q set attempts = 0, next_attempt_at = now(), lease = null
     where q.lease = p_lease;
  else
    delete from memchat.summary_queue q where q.lease = p_lease;
  end if;
end
$$;

-- A leased item's refresh failed: retry in p_retry_in seconds (null: not
-- until the session's next turn queues it again). Returns the failures in a
-- row. A lease is one queue item's (gen_random_uuid() per claimed row).
create function memchat.summary_failed(p_lease uuid, p_retry_in double precision)
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
  update memchat.summary_queue q
     set attempts = q.attempts + 1,
         lease = null,
         next_attempt_at = v_retry_at
   where q.lease = p_lease and q.next_attempt_at > now()
  returning q.attempts into v_attempts;
  return v_attempts;
end
$$;
