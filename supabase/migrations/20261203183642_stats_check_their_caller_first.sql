-- Written by `memchat db diff`: what supabase/schemas has that the
-- migrations before this one did not make:
--   function memchat.chat_stats(uuid,text)

set local check_function_bodies = off;

CREATE OR REPLACE FUNCTION memchat.chat_stats(p_user_id uuid, p_agent_name text)
 RETURNS jsonb
 LANGUAGE plpgsql
 STABLE
 SET search_path TO ''
AS $function$
declare
  -- The caller, a parameter of each statement: on Citus, its shard.
  v_uid uuid := auth.uid();
  v_stored bigint;
  v_max bigint;
begin
  -- The caller as the API names it: on Citus the call is delegated by it
  -- to the worker holding that user's shards (`memchat db distribute`).
  -- Checked before any read (on Citus, one of another user's rows there
  -- is refused as not the distribution argument's).
  if p_user_id is distinct from v_uid then
    raise exception 'the caller is not user %', p_user_id using errcode = '42501';
  end if;
  -- Read first, each in a statement of its own (on Citus, a function
  -- reading a distributed table cannot run inside a statement that does).
  v_stored := memchat.stored_messages();
  v_max := memchat.max_stored_messages();
  return (
    with s as (
      select s.* from public.chat_sessions s
       where s.user_id = v_uid
         and (p_agent_name is null or s.agent_name = p_agent_name)),
    f as (
      select f.rating, f.comment from memchat.message_feedback f
       where f.user_id = v_uid
         and (p_agent_name is null or f.agent_name = p_agent_name))
    select jsonb_build_object(
      'agent_name', p_agent_name,
      'sessions', jsonb_build_object(
          'total', count(*),
          'active', count(*) filter (where s.status = 'active' and s.expires_at > now()),
          'cleared', count(*) filter (where s.status = 'cleared')),
      'messages', coalesce(sum(s.message_count), 0),
      'turns', coalesce(sum(s.turn_count), 0),
      'tokens', jsonb_build_object(
          'prompt', coalesce(sum(s.prompt_tokens), 0),
          'completion', coalesce(sum(s.completion_tokens), 0)),
      'feedback', (select jsonb_build_object(
          'positive', count(*) filter (where f.rating = 1),
          'negative', count(*) filter (where f.rating = -1),
          'neutral', count(*) filter (where f.rating = 0),
          'with_comment', count(*) filter (where f.comment is not null)) from f),
      'first_activity_at', min(s.created_at),
      'last_activity_at', max(s.last_active_at),
      'avg_messages_per_session', coalesce(round(avg(s.message_count), 2), 0),
      'storage', jsonb_build_object(
          'stored_messages', v_stored,
          'max_stored_messages', v_max))
    from s);
end
$function$;
