-- The limits of memchat.limits (tables/limits.sql), held for every writer:
-- the triggers on the user tables (triggers.sql) and the quota on stored
-- messages. SQLSTATE MC413: too large; MC422: not an allowed value; MCQTA:
-- past the quota (DETAIL: the limit). The limits are read by a statement of
-- their own (`select ... into`), not a subquery: on Citus a statement on one
-- table without subqueries takes its short planning path.

-- now() + ttl, never beyond the maximum TTL.
create function memchat.session_expiry(p_ttl interval) returns timestamptz
language plpgsql stable
set search_path = ''
as $$
declare
  v_max interval;
begin
  select l.max_session_ttl into v_max from memchat.limits l;
  return now() + least(p_ttl, v_max);
end
$$;

-- Every stored message: LangChain's shape, a type memchat stores, within
-- the size limits. A user message is held here to the larger of the two
-- text bounds (an imported one may be longer); record_turn holds a new
-- turn's to max_message_chars (what may be sent to the model).
create function memchat.check_message() returns trigger
language plpgsql
set search_path = ''
as $$
declare
  v_limits memchat.limits;
  v_type text := new.message->>'type';
begin
  select * into v_limits from memchat.limits;
  if jsonb_typeof(new.message) is distinct from 'object'
     or jsonb_typeof(new.message->'data') is distinct from 'object' then
    raise exception 'a message must be {"type": ..., "data": {...}}' using errcode = 'MC422';
  end if;
  if v_type is null or v_type not in ('human', 'ai', 'tool') then
    raise exception 'message type % is not allowed', coalesce(v_type, 'null')
      using errcode = 'MC422';
  end if;
  if octet_length(new.message::text) > v_limits.max_message_bytes then
    raise exception 'message is over % bytes', v_limits.max_message_bytes using errcode = 'MC413';
  end if;
  if v_type = 'human'
     and char_length(new.message->'data'->>'content')
         > greatest(v_limits.max_message_chars, v_limits.max_import_message_chars) then
    raise exception 'message is over % characters',
      greatest(v_limits.max_message_chars, v_limits.max_import_message_chars)
      using errcode = 'MC413';
  end if;
  return new;
end
$$;

create function memchat.check_notes() returns trigger
language plpgsql
set search_path = ''
as $$
declare
  v_max integer;
begin
  select l.max_notes_chars into v_max from memchat.limits l;
  if char_length(new.notes) > v_max then
    raise exception 'notes are over % characters', v_max using errcode = 'MC413';
  end if;
  return new;
end
$$;

-- Only a new or moved expiry is checked: lowering the maximum must not make
-- existing sessions impossible to update (clear, say).
create function memchat.check_session() returns trigger
language plpgsql
set search_path = ''
as $$
declare
  v_max interval;
begin
  if tg_op = 'INSERT' or new.expires_at is distinct from old.expires_at then
    select l.max_session_ttl into v_max from memchat.limits l;
    if new.expires_at > now() + v_max then
      raise exception 'expires_at is beyond the maximum session TTL' using errcode = 'MC422';
    end if;
  end if;
  return new;
end
$$;

-- The quota: the most messages a user's live sessions may hold
-- (max_stored_messages). An expired session holds none (it is gone for
-- every purpose, whether or not the cleanup has deleted it yet). Every
-- write of messages (a chat turn, an import) is refused whole past it,
-- under a lock per user, so two writes at once cannot both pass it.

-- The caller's messages: those of their live sessions (each session keeps
-- its count; a cleared one counts 0). It reads one user's sessions: by the
-- index led by user_id, whatever the table's statistics say (a small
-- table's could choose a sequential scan, which would also read other
-- users' rows and make the work depend on them), and with one plan for
-- every call.
create function memchat.stored_messages() returns bigint
language plpgsql stable
set search_path = ''
set enable_seqscan = off
set plan_cache_mode = force_generic_plan
as $$
declare
  -- The caller, a parameter of each statement: on Citus, its shard.
  v_uid uuid := auth.uid();
  v_stored bigint;
begin
  select coalesce(sum(s.message_count), 0)::bigint into v_stored from public.chat_sessions s
   where s.user_id = v_uid and s.expires_at > now();
  return v_stored;
end
$$;

-- The lower of memchat.limits' and the API's own (USER_MAX_STORED_MESSAGES,
-- set in each request's transaction as memchat.max_stored_messages:
-- store/db.py's SET_CLAIMS).
create function memchat.max_stored_messages() returns bigint
language plpgsql stable
set search_path = ''
as $$
declare
  v_api text := pg_catalog.current_setting('memchat.max_stored_messages', true);
  v_max bigint;
begin
  select l.max_stored_messages into v_max from memchat.limits l;
  return least(v_max, case when v_api ~ '^[0-9]{1,18}$' then v_api::bigint end);
end
$$;

-- Raises MCQTA (DETAIL: the limit) when storing p_adding more messages
-- would take the caller past max_stored_messages. The lock (per user, to
-- the transaction's end: safe behind a transaction-mode pooler) makes a
-- concurrent write wait until this one has committed and counts it.
create function memchat.hold_stored_messages(p_adding bigint) returns void
language plpgsql
set search_path = ''
as $$
declare
  v_max bigint := memchat.max_stored_messages();
  v_stored bigint;
begin
  perform pg_catalog.pg_advisory_xact_lock(
    pg_catalog.hashtextextended('memchat.stored_messages/' || auth.uid()::text, 0));
  v_stored := memchat.stored_messages();
  if v_stored + p_adding > v_max then
    raise exception 'storing % more messages would pass the limit of % (% stored)',
      p_adding, v_max, v_stored
      using errcode = 'MCQTA', detail = v_max::text;
  end if;
end
$$;
