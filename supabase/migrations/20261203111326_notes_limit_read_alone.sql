-- Written by `memchat db diff`: what supabase/schemas has that the
-- migrations before this one did not make:
--   function memchat.keep_notes_version()

set local check_function_bodies = off;

CREATE OR REPLACE FUNCTION memchat.keep_notes_version()
 RETURNS trigger
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO ''
AS $function$
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
  v_kept := (select l.notes_versions_kept from memchat.limits l);
  delete from memchat.notes_versions v
   where v.user_id = new.user_id and v.agent_name = new.agent_name
     and v.version <= new.version - v_kept;
  return null;
end
$function$;
