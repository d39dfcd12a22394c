-- Written by `memchat db diff`: what supabase/schemas has that the
-- migrations before this one did not make:
--   function memchat.import_memories(jsonb,integer) (dropped)
--   function memchat.import_memories(uuid,jsonb,integer)
--   privileges on function memchat.import_memories(uuid,jsonb,integer)

set local check_function_bodies = off;

drop function if exists memchat.import_memories(jsonb,integer);

CREATE OR REPLACE FUNCTION memchat.import_memories(p_user_id uuid, p_memories jsonb, p_retention_days integer)
 RETURNS integer
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO ''
AS $function$
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
$function$;

revoke all on function memchat.import_memories(uuid,jsonb,integer) from public;

grant execute on function memchat.import_memories(uuid,jsonb,integer) to memchat_user;
