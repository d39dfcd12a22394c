-- A session's rolling summary kept as a durable memory (kind summary, one
-- per session, ordinal -1), written by the summary worker
-- (memchat.summary_remember; supabase/schemas: tables/memories.sql,
-- functions/summaries.sql, grants.sql).

alter table memchat.memories drop constraint if exists memories_kind_check;
alter table memchat.memories drop constraint if exists memories_ordinal_check;
alter table memchat.memories
  add constraint memories_kind_check check (kind in ('fact', 'assistant', 'summary')),
  add constraint memories_ordinal_check
    check ((kind = 'summary') = (ordinal = -1) and ordinal >= -1);

set local check_function_bodies = off;

CREATE OR REPLACE FUNCTION memchat.summary_remember(p_lease uuid, p_summary text, p_model text, p_embedding text)
 RETURNS boolean
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO ''
AS $function$
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
$function$;

revoke all on function memchat.summary_remember(uuid,text,text,text) from public;

grant execute on function memchat.summary_remember(uuid,text,text,text) to memchat_worker;

comment on table memchat.memories is 'Durable memory: the facts each message stated and each session''s summary, with their date and session; outlives the transcript by MEMORY_RETENTION_DAYS (supabase/schemas/tables/memories.sql).';
