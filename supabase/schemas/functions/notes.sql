-- The long-term notes (tables/notes.sql): writing them, their versions,
-- restoring one.

-- Writes the caller's notes for an agent with an optimistic version check:
-- p_expected_version null = unconditional, 0 = "there were no notes",
-- n = "the notes I read had version n". A mismatch raises SQLSTATE MC409
-- so the whole transaction rolls back and the caller can re-read and retry.
-- p_user_id: the caller, as the API names it (on Citus, the worker the call
-- is delegated to).
create function memchat.save_notes(
  p_user_id uuid, p_agent_name text, p_notes text, p_expected_version integer
)
returns integer
language plpgsql
set search_path = ''
as $$
declare
  -- The caller, a parameter of each statement: on Citus, its shard.
  v_uid uuid := auth.uid();
  -- now() itself in ON CONFLICT DO UPDATE: refused by Citus (docs/deploy.md).
  v_now timestamptz := now();
  v_version integer;
begin
  -- The caller as the API names it: on Citus the call is delegated by it
  -- to the worker holding that user's shards (`memchat db distribute`).
  if p_user_id is distinct from v_uid then
    raise exception 'the caller is not user %', p_user_id using errcode = '42501';
  end if;
  if p_expected_version is null then
    insert into public.agent_long_term_memory as m (user_id, agent_name, notes)
    values (v_uid, p_agent_name, p_notes)
    on conflict (user_id, agent_name) do update
      set notes = excluded.notes, version = m.version + 1, updated_at = v_now
    returning m.version into v_version;
  elsif p_expected_version = 0 then
    insert into public.agent_long_term_memory as m (user_id, agent_name, notes)
    values (v_uid, p_agent_name, p_notes)
    on conflict (user_id, agent_name) do nothing
    returning m.version into v_version;
  else
    update public.agent_long_term_memory as m
       set notes = p_notes, version = m.version + 1, updated_at = v_now
     where m.user_id = v_uid and m.agent_name = p_agent_name
       and m.version = p_expected_version
    returning m.version into v_version;
  end if;
  if v_version is null then
    raise exception 'long-term notes of agent % changed concurrently', p_agent_name
      using errcode = 'MC409';
  end if;
  return v_version;
end
$$;

-- The caller's notes of an agent set back to an earlier version's text (a
-- new version; p_expected_version as in memchat.save_notes). Null when there
-- is no such version.
create function memchat.restore_notes(
  p_user_id uuid, p_agent_name text, p_version integer, p_expected_version integer
) returns integer
language plpgsql
set search_path = ''
as $$
declare
  -- The caller, a parameter of each statement: on Citus, its shard.
  v_uid uuid := auth.uid();
  v_notes text;
begin
  -- The caller as the API names it: on Citus the call is delegated by it
  -- to the worker holding that user's shards (`memchat db distribute`).
  if p_user_id is distinct from v_uid then
    raise exception 'the caller is not user %', p_user_id using errcode = '42501';
  end if;
  select v.notes into v_notes from memchat.notes_versions v
   where v.user_id = v_uid and v.agent_name = p_agent_name
     and v.version = p_version;
  if not found then
    return null;
  end if;
  return memchat.save_notes(v_uid, p_agent_name, v_notes, p_expected_version);
end
$$;

-- The trigger that keeps the versions (trigger
-- agent_long_term_memory_versions): every write of the notes is a version,
-- the last memchat.limits.notes_versions_kept of them kept; deleting the
-- notes deletes them. SECURITY DEFINER, so no role writes versions itself.
create function memchat.keep_notes_version() returns trigger
language plpgsql
security definer
set search_path = ''
as $$
declare
  v_kept integer;
begin
  if tg_op = 'DELETE' then
    delete from memchat.notes_versions v
     where v.user_id = old.user_id and v.agent_name = old.agent_name;
    return null;
  end if;
  insert into memchat.notes_versions (user_id, agent_name, version, notes, created_at)
  values (new.user_id, new.agent_name, new.version, new.notes, new.updated_at)
  on conflict (user_id, agent_name, version) do update
     set notes = excluded.notes, created_at = excluded.created_at;
  -- The limit read on its own: on Citus, where record_turn runs delegated
  -- to the user's worker, a statement there may read only that user's
  -- rows, which a subquery of another table is not.
  select l.notes_versions_kept into v_kept from memchat.limits l;
  delete from memchat.notes_versions v
   where v.user_id = new.user_id and v.agent_name = new.agent_name
     and v.version <= new.version - v_kept;
  return null;
end
$$;
