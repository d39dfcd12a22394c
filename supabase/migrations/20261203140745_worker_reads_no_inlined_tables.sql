-- Written by `memchat db diff`: what supabase/schemas has that the
-- migrations before this one did not make:
--   function memchat.embedding_backlog()
--   function memchat.embedding_done(uuid,text)
--   function memchat.embedding_failed(uuid,double precision)
--   function memchat.embedding_source(uuid,text,bigint,integer)
--   function memchat.embedding_statistics()
--   function memchat.summary_failed(uuid,double precision)
--   function memchat.unembedded_messages(uuid,uuid,text)
--   privileges on function memchat.unembedded_messages(uuid,uuid,text)

set local check_function_bodies = off;

CREATE OR REPLACE FUNCTION memchat.embedding_backlog(OUT pending integer, OUT failed integer)
 RETURNS record
 LANGUAGE plpgsql
 STABLE
 SET search_path TO ''
AS $function$
declare
  -- The caller, a parameter of each statement: on Citus, its shard.
  v_uid uuid := auth.uid();
  v_sessions uuid[];
  v_given_up boolean[];
begin
  -- The queued live sessions first; their messages in a statement that
  -- reads no table itself (memchat.unembedded_messages).
  select coalesce(array_agg(q.session_id), '{}'),
         coalesce(array_agg(q.next_attempt_at = 'infinity'), '{}')
    into v_sessions, v_given_up
    from memchat.embedding_queue q
    join public.chat_sessions s on s.id = q.session_id and s.user_id = v_uid
   where q.user_id = v_uid
     and s.status = 'active' and s.expires_at > now();
  select (count(*) filter (where not q.given_up))::integer,
         (count(*) filter (where q.given_up))::integer
    into pending, failed
    from unnest(v_sessions, v_given_up) q(session_id, given_up)
    cross join lateral memchat.unembedded_messages(v_uid, q.session_id, null) u;
end
$function$;

CREATE OR REPLACE FUNCTION memchat.embedding_done(p_lease uuid, p_model text)
 RETURNS boolean
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO ''
AS $function$
declare
  v_item memchat.embedding_queue := memchat.embedding_leased(p_lease);
  v_more boolean := false;
begin
  if v_item.session_id is null then
    return false;
  end if;
  -- Each read in a statement of its own: memchat.unembedded_messages in
  -- one that reads no table itself.
  if exists (
       select 1 from public.chat_sessions s
        where s.id = v_item.session_id and s.user_id = v_item.user_id
          and s.status = 'active' and s.expires_at > now()) then
    v_more := exists (
      select 1 from memchat.unembedded_messages(v_item.user_id, v_item.session_id, p_model));
  end if;
  if v_more then
    update memchat.embedding_queue q set attempts = 0, next_attempt_at = now(), lease = null
     where q.lease = p_lease;
    return false;
  end if;
  delete from memchat.embedding_queue q where q.lease = p_lease;
  return true;
end
$function$;

CREATE OR REPLACE FUNCTION memchat.embedding_failed(p_lease uuid, p_retry_in double precision)
 RETURNS integer
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO ''
AS $function$
declare
  v_attempts integer;
  -- Taken first: Citus refuses now() in a CASE of a distributed UPDATE.
  v_retry_at timestamptz := case when p_retry_in is null then 'infinity'::timestamptz
                                 else now() + make_interval(secs => p_retry_in) end;
begin
  update memchat.embedding_queue q
     set attempts = q.attempts + 1,
         lease = null,
         next_attempt_at = v_retry_at
   where q.lease = p_lease and q.next_attempt_at > now()
  returning q.attempts into v_attempts;
  return v_attempts;
end
$function$;

CREATE OR REPLACE FUNCTION memchat.embedding_source(p_lease uuid, p_model text, p_after bigint, p_limit integer)
 RETURNS jsonb
 LANGUAGE plpgsql
 STABLE SECURITY DEFINER
 SET search_path TO ''
AS $function$
declare
  v_item memchat.embedding_queue := memchat.embedding_leased(p_lease);
  v_ids bigint[];
  v_messages jsonb[];
begin
  if v_item.session_id is null or not exists (
       select 1 from public.chat_sessions s
        where s.id = v_item.session_id and s.user_id = v_item.user_id
          and s.status = 'active' and s.expires_at > now()) then
    return '[]'::jsonb;
  end if;
  -- The messages first, in a statement that reads no table itself
  -- (memchat.unembedded_messages), then whether each has its embedding.
  select coalesce(array_agg(u.id order by u.id), '{}'),
         coalesce(array_agg(u.message order by u.id), '{}')
    into v_ids, v_messages
    from (select u.id, u.message
            from memchat.unembedded_messages(v_item.user_id, v_item.session_id, p_model) u
           where u.id > p_after
           order by u.id
           limit p_limit) u;
  return (
    select coalesce(jsonb_agg(jsonb_build_object(
             'id', m.id, 'text', m.message->'data'->>'content',
             'asked', memchat.asked(m.message),
             'embedded', exists (select 1 from memchat.message_embeddings e
                                  where e.message_id = m.id and e.user_id = v_item.user_id
                                    and e.model = p_model))
             order by m.id), '[]'::jsonb)
      from unnest(v_ids, v_messages) m(id, message));
end
$function$;

CREATE OR REPLACE FUNCTION memchat.embedding_statistics()
 RETURNS integer
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO ''
AS $function$
declare
  v_keys pg_catalog.regclass;
  v_counted real;
  v_enough bigint;
  v_present bigint;
  v_analysed integer := 0;
begin
  for v_keys in
    select i.inhrelid::pg_catalog.regclass
      from pg_catalog.pg_inherits i
     where i.inhparent = 'memchat.message_embeddings'::pg_catalog.regclass
     order by 1
  loop
    -- -1: never analysed (nor vacuumed).
    select c.reltuples into v_counted from pg_catalog.pg_class c where c.oid = v_keys;
    continue when v_counted >= 5000;
    v_enough := greatest(2 * v_counted, 1000)::bigint;
    execute pg_catalog.format('select count(*) from (select 1 from %s limit $1) k', v_keys)
       into v_present using v_enough;
    continue when v_present < v_enough;
    execute pg_catalog.format('analyze %s', v_keys);
    -- Its sibling: memchat.message_facts_pNN for memchat.message_embeddings_pNN.
    v_keys := pg_catalog.to_regclass(
      pg_catalog.replace(v_keys::text, 'memchat.message_embeddings_', 'memchat.message_facts_'));
    if v_keys is not null then
      execute pg_catalog.format('analyze %s', v_keys);
    end if;
    v_analysed := v_analysed + 1;
  end loop;
  -- What this run analysed, and what autovacuum did since the last run.
  perform memchat.copy_word_statistics();
  return v_analysed;
end
$function$;

CREATE OR REPLACE FUNCTION memchat.summary_failed(p_lease uuid, p_retry_in double precision)
 RETURNS integer
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO ''
AS $function$
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
$function$;

drop function if exists memchat.unembedded_messages(uuid,uuid,text);

CREATE OR REPLACE FUNCTION memchat.unembedded_messages(p_user_id uuid, p_session_id uuid, p_model text)
 RETURNS TABLE(id bigint, message jsonb)
 LANGUAGE plpgsql
 STABLE
 SET search_path TO ''
AS $function$
begin
  return query
    select h.id, h.message from public.chat_message_history h
     where h.user_id = p_user_id and h.session_id = p_session_id
       and memchat.embeddable(h.message)
       and not exists (select 1 from memchat.message_embeddings e
                        where e.message_id = h.id and e.user_id = p_user_id
                          and (p_model is null or e.model = p_model)
                          and (e.facts_model is not distinct from e.model
                               or exists (select 1 from memchat.message_facts_made m
                                           where m.message_id = e.message_id
                                             and m.user_id = p_user_id
                                             and m.model = e.model)));
end
$function$;

revoke all on function memchat.unembedded_messages(uuid,uuid,text) from public;

grant execute on function memchat.unembedded_messages(uuid,uuid,text) to memchat_user;
