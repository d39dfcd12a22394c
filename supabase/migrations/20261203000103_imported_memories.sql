-- Durable memories an import brings (memchat.import_memories), recall's
-- memories in one call (memchat.recall_memories), and the
-- backfill embedding the memories without an embedding
-- (memchat.memory_embedding_source, memory_embedding_save; supabase/schemas:
-- tables/memories.sql, functions/memories.sql, grants.sql).

create index if not exists memories_unembedded_idx on memchat.memories (id)
  where embedding is null;

set local check_function_bodies = off;

CREATE OR REPLACE FUNCTION memchat.import_memories(p_memories jsonb, p_retention_days integer)
 RETURNS integer
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO ''
AS $function$
declare
  v_user uuid := (select auth.uid());
  v_stored integer;
begin
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

CREATE OR REPLACE FUNCTION memchat.memory_embedding_save(p_ids bigint[], p_users uuid[], p_model text, p_embeddings text[])
 RETURNS integer
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO ''
AS $function$
declare
  v_stored integer;
begin
  update memchat.memories m
     set embedding = x.embedding::extensions.vector, model = p_model
    from unnest(p_ids, p_users, p_embeddings) as x(id, user_id, embedding)
   where m.id = x.id and m.user_id = x.user_id and m.embedding is null;
  get diagnostics v_stored = row_count;
  return v_stored;
end
$function$;

CREATE OR REPLACE FUNCTION memchat.memory_embedding_source(p_after bigint, p_limit integer)
 RETURNS jsonb
 LANGUAGE plpgsql
 STABLE SECURITY DEFINER
 SET search_path TO ''
AS $function$
begin
  return (
  select coalesce(jsonb_agg(jsonb_build_object('id', m.id, 'user_id', m.user_id, 'text', m.text)
                            order by m.id), '[]'::jsonb)
    from (select m.id, m.user_id, m.text from memchat.memories m
           where m.embedding is null and m.id > p_after
           order by m.id
           limit p_limit) m);
end
$function$;

revoke all on function memchat.import_memories(jsonb,integer) from public;

grant execute on function memchat.import_memories(jsonb,integer) to memchat_user;

revoke all on function memchat.memory_embedding_save(bigint[],uuid[],text,text[]) from public;

grant execute on function memchat.memory_embedding_save(bigint[],uuid[],text,text[]) to memchat_worker;

revoke all on function memchat.memory_embedding_source(bigint,integer) from public;

grant execute on function memchat.memory_embedding_source(bigint,integer) to memchat_worker;

CREATE OR REPLACE FUNCTION memchat.recall_memories(p_agent_name text, p_query extensions.vector, p_model text, p_text text, p_limit integer, p_min_score double precision)
 RETURNS jsonb
 LANGUAGE plpgsql
 STABLE
 SET search_path TO ''
AS $function$
begin
  if not exists (select 1 from memchat.memories m
                  where m.user_id = (select auth.uid()) and m.agent_name = p_agent_name
                    and m.expires_at is not null) then
    return '[]'::jsonb;
  end if;
  return (
    select coalesce(jsonb_agg(jsonb_build_object(
             'memory_id', m.id, 'kind', m.kind, 'text', m.text, 'session_id', m.session_id,
             'message_id', m.message_id, 'created_at', m.created_at, 'score', f.score)
             order by f.ordinality), '[]'::jsonb)
      from memchat.search_memories(p_agent_name, p_query, p_model, p_text, p_limit,
                                   p_min_score, true) with ordinality f
      join memchat.memories m on m.id = f.id and m.user_id = (select auth.uid()));
end
$function$;

revoke all on function memchat.recall_memories(text,extensions.vector,text,text,integer,double precision) from public;

grant execute on function memchat.recall_memories(text,extensions.vector,text,text,integer,double precision) to memchat_user;
