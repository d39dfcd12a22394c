-- Durable memory apart from the transcript: memchat.memories (the facts
-- each message stated, kept MEMORY_RETENTION_DAYS past their session) and
-- memchat.forgotten_memories (supabase/schemas: tables/memories.sql,
-- functions/memories.sql, functions/cleanup.sql, triggers.sql).

create table if not exists memchat.memories (
  id bigint generated always as identity,
  user_id uuid not null references auth.users (id) on delete cascade,
  agent_name text not null check (agent_name ~ '^[A-Za-z0-9_.-]{1,64}$'),
  -- fact: a sentence in which the user speaks of themselves; assistant: one
  -- in which the assistant does (memchat.usecases.recall.facts).
  kind text not null check (kind in ('fact', 'assistant')),
  text text not null check (char_length(text) between 1 and 4000),
  -- Where it was stated: no foreign keys, as both go before the memory does.
  session_id uuid not null,
  message_id bigint not null,
  ordinal smallint not null check (ordinal >= 0),
  -- When it was stated (its message's created_at).
  created_at timestamptz not null,
  expires_at timestamptz,
  -- The embedding (of `model`, as the message keys'; null after a change of
  -- the column's size, `memchat db reembed --dimensions`: found by words
  -- only) and the words recall finds it by.
  model text,
  embedding extensions.vector(512),
  lexemes tsvector generated always as (to_tsvector('english'::regconfig, text)) stored,
  primary key (user_id, id),
  unique (user_id, message_id, ordinal)
);
alter table memchat.memories alter column embedding set storage main;
-- The size of the stored keys (a database made for another model's).
do $$
begin
  if memchat.embedding_dimensions() <> 512 then
    execute format('alter table memchat.memories alter column embedding type extensions.vector(%s)',
                   memchat.embedding_dimensions());
  end if;
end
$$;

create index if not exists memories_owner_idx on memchat.memories
  (user_id, created_at desc, message_id desc, ordinal desc);
create index if not exists memories_session_idx on memchat.memories (session_id) where expires_at is null;
create index if not exists memories_expiry_idx on memchat.memories (expires_at) where expires_at is not null;
create index if not exists memories_durable_idx on memchat.memories (user_id, agent_name)
  where expires_at is not null;

-- What a user deleted of the memories a message made (DELETE /memories/{id}):
-- memchat.memories_save never writes them again (`memchat db reembed` reads
-- the message anew). Goes with its message (memchat.delete_message_dependents).
create table if not exists memchat.forgotten_memories (
  message_id bigint not null,
  ordinal smallint not null,
  user_id uuid not null references auth.users (id) on delete cascade,
  primary key (message_id, ordinal, user_id)
);
create index if not exists forgotten_memories_user_idx on memchat.forgotten_memories (user_id);


set local check_function_bodies = off;

CREATE OR REPLACE FUNCTION memchat.delete_message_dependents()
 RETURNS trigger
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO ''
AS $function$
declare
  -- As an array, so each delete is a primary-key lookup per id whatever the
  -- statement's size (a transition table has no statistics to plan a join by).
  ids bigint[] := array(select g.id from gone g);
  v_part record;
begin
  -- Each statement is planned when it runs (EXECUTE); the ids come through a
  -- subquery, so that the planner does not estimate every one of them (what
  -- a plan of the array's value would do, a millisecond per thousand ids).
  -- One partition computed per row; its tables named once per partition,
  -- from one of its users.
  for v_part in
    select (array_agg(g.user_id))[1] as owner, array_agg(g.id) as ids
      from gone g group by memchat.key_partition(g.user_id)
  loop
    execute format('delete from memchat.%I e where e.message_id = any((select $1)::bigint[])',
                   memchat.key_partition_name('message_embeddings', v_part.owner))
      using v_part.ids;
    execute format('delete from memchat.%I f where f.message_id = any((select $1)::bigint[])',
                   memchat.key_partition_name('message_facts', v_part.owner))
      using v_part.ids;
  end loop;
  delete from memchat.message_facts_made m where m.message_id = any(ids);
  delete from memchat.forgotten_memories f where f.message_id = any(ids);
  delete from memchat.message_feedback f where f.message_id = any(ids);
  perform set_config('memchat.deleted_messages',
    (coalesce(nullif(current_setting('memchat.deleted_messages', true), ''), '0')::bigint
     + cardinality(ids))::text, true);
  return null;
end
$function$;

CREATE OR REPLACE FUNCTION memchat.index_round()
 RETURNS trigger
 LANGUAGE plpgsql
 SET search_path TO ''
AS $function$
declare
  v_message jsonb;
  v_answer text;
begin
  select h.message into v_message
    from public.chat_message_history h
   where h.id = new.message_id;
  if v_message->>'type' = 'ai' then
    new.facts_model := new.model;
    new.exchange_id := (
      select x.id from public.chat_message_history x
       where x.user_id = new.user_id and x.session_id = new.session_id
         and x.id < new.message_id and memchat.asked(x.message)
       order by x.id desc
       limit 1);
    new.lexemes := case when new.exchange_id is null then memchat.owned_lexemes(
                     memchat.round_lexemes(null, v_message->'data'->>'content'), new.user_id) end;
    return new;
  end if;
  v_answer := memchat.answer_of(new.message_id);
  new.exchange_id := null;
  new.lexemes := memchat.owned_lexemes(
    memchat.round_lexemes(v_message->'data'->>'content', v_answer), new.user_id);
  -- The backfill reads every user message once: its fact keys, and what
  -- durable memory keeps of it (functions/memories.sql).
  new.facts_model := null;
  insert into memchat.embedding_queue as q (session_id, user_id)
  values (new.session_id, new.user_id)
  on conflict (session_id, user_id) do update set attempts = 0, next_attempt_at = now()
   where q.next_attempt_at = 'infinity';
  return new;
end
$function$;

CREATE OR REPLACE FUNCTION memchat.keep_memories()
 RETURNS trigger
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO ''
AS $function$
declare
  v_days integer := nullif(current_setting('memchat.memory_retention_days', true), '')::integer;
begin
  if v_days is null then
    delete from memchat.memories m using gone g
     where m.session_id = g.id and m.user_id = g.user_id and m.expires_at is null;
  else
    update memchat.memories m
       set expires_at = g.expires_at + make_interval(days => v_days)
      from gone g
     where m.session_id = g.id and m.user_id = g.user_id and m.expires_at is null;
  end if;
  return null;
end
$function$;

CREATE OR REPLACE FUNCTION memchat.memories_save(p_leases uuid[], p_model text, p_ids bigint[], p_ordinals integer[], p_kinds text[], p_texts text[], p_embeddings text[])
 RETURNS integer
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO ''
AS $function$
declare
  v_stored integer;
begin
  with stored as (
    insert into memchat.memories as m
        (user_id, agent_name, kind, text, session_id, message_id, ordinal, created_at,
         model, embedding)
    select h.user_id, s.agent_name, x.kind, x.text, h.session_id, h.id, x.ordinal,
           h.created_at, p_model,
           coalesce(x.embedding::extensions.vector,
                    (select e.embedding from memchat.message_embeddings e
                      where e.message_id = h.id and e.user_id = h.user_id and e.model = p_model))
      from unnest(p_leases, p_ids, p_ordinals, p_kinds, p_texts, p_embeddings)
           as x(lease, id, ordinal, kind, text, embedding)
      join memchat.embedding_queue q on q.lease = x.lease and q.next_attempt_at > now()
      join public.chat_message_history h
        on h.id = x.id and h.user_id = q.user_id and h.session_id = q.session_id
      join public.chat_sessions s on s.id = q.session_id and s.user_id = q.user_id
     where p_model is not null
       and (x.embedding is not null
            or exists (select 1 from memchat.message_embeddings e
                        where e.message_id = h.id and e.user_id = h.user_id
                          and e.model = p_model))
       and not exists (select 1 from memchat.forgotten_memories f
                        where f.message_id = h.id and f.ordinal = x.ordinal
                          and f.user_id = h.user_id)
    on conflict (user_id, message_id, ordinal) do update
       set kind = excluded.kind, text = excluded.text, model = excluded.model,
           embedding = excluded.embedding
    returning 1
  )
  select count(*)::integer into v_stored from stored;
  return v_stored;
end
$function$;

drop function if exists memchat.says_several_things(text);

CREATE OR REPLACE FUNCTION memchat.search_memories(p_agent_name text, p_query extensions.vector, p_model text, p_text text, p_limit integer, p_min_score double precision, p_durable boolean)
 RETURNS TABLE(id bigint, score double precision)
 LANGUAGE plpgsql
 STABLE
 SET search_path TO ''
AS $function$
declare
  v_words tsquery := memchat.any_words(p_text);
  v_ids bigint[];
begin
  if p_durable then
    select array_agg(m.id) into v_ids from memchat.memories m
     where m.user_id = (select auth.uid()) and m.agent_name = p_agent_name
       and m.expires_at is not null;
  else
    select array_agg(m.id) into v_ids from memchat.memories m
     where m.user_id = (select auth.uid()) and m.agent_name = p_agent_name;
  end if;
  if v_ids is null then
    return;
  end if;
  return query
  with own as materialized (
    select m.id, m.model, m.embedding, m.lexemes
      from memchat.memories m
     where m.user_id = (select auth.uid()) and m.id = any(v_ids)
  ), meaning as (
    select o.id, row_number() over (order by o.embedding operator(extensions.<=>) p_query, o.id desc)
             as r
      from own o
     where p_query is not null and o.model = p_model
     order by r
     limit p_limit * 2
  ), words as (
    select o.id,
           row_number() over (order by pg_catalog.ts_rank(o.lexemes, v_words) desc, o.id desc) as r
      from own o
     where v_words is not null and o.lexemes operator(pg_catalog.@@) v_words
     order by r
     limit p_limit * 2
  ), fused as (
    select coalesce(a.id, b.id) as id,
           coalesce(1.0 / (20 + a.r), 0) + coalesce(1.0 / (20 + b.r), 0) as fused
      from meaning a
      full join words b on b.id = a.id
  )
  select f.id, x.similarity
    from fused f
    join own o on o.id = f.id
   cross join lateral (
     select case when p_query is not null and o.model = p_model
                 then 1 - (o.embedding operator(extensions.<=>) p_query) end as similarity) x
   where p_query is null or x.similarity >= p_min_score
   order by f.fused desc, f.id desc
   limit p_limit;
end
$function$;

CREATE OR REPLACE FUNCTION memchat.truncate_message_dependents()
 RETURNS trigger
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO ''
AS $function$
begin
  -- A `truncate ... cascade` may have truncated one of them already, in this
  -- same statement (message_feedback references the sessions): a second
  -- truncate of it is refused (object_in_use), so it is emptied by a delete.
  begin
    truncate memchat.message_embeddings;
  exception when object_in_use then
    delete from memchat.message_embeddings;
  end;
  begin
    truncate memchat.message_facts;
  exception when object_in_use then
    delete from memchat.message_facts;
  end;
  truncate memchat.message_facts_made;  -- referenced by nothing, truncated by nothing else
  truncate memchat.forgotten_memories;
  begin
    truncate memchat.message_feedback;
  exception when object_in_use then
    delete from memchat.message_feedback;
  end;
  return null;
end
$function$;

drop policy if exists forgotten_memories_insert on memchat.forgotten_memories;
create policy forgotten_memories_insert on memchat.forgotten_memories for insert to memchat_user
  with check ((user_id = ( SELECT auth.uid() AS uid)));

drop policy if exists memories_cleanup_delete on memchat.memories;
create policy memories_cleanup_delete on memchat.memories for delete to memchat_cleanup
  using ((expires_at <= now()));

drop policy if exists memories_cleanup_select on memchat.memories;
create policy memories_cleanup_select on memchat.memories for select to memchat_cleanup
  using ((expires_at <= now()));

drop policy if exists memories_delete on memchat.memories;
create policy memories_delete on memchat.memories for delete to memchat_user
  using ((user_id = ( SELECT auth.uid() AS uid)));

drop policy if exists memories_select on memchat.memories;
create policy memories_select on memchat.memories for select to memchat_user
  using ((user_id = ( SELECT auth.uid() AS uid)));

alter table memchat.forgotten_memories enable row level security;

alter table memchat.memories enable row level security;

drop trigger if exists chat_sessions_memories on public.chat_sessions;
CREATE TRIGGER chat_sessions_memories AFTER DELETE ON public.chat_sessions REFERENCING OLD TABLE AS gone FOR EACH STATEMENT EXECUTE FUNCTION memchat.keep_memories();

grant insert on table memchat.forgotten_memories to memchat_user;

grant delete on table memchat.memories to memchat_cleanup;

grant select, delete on table memchat.memories to memchat_user;

grant select (expires_at) on table memchat.memories to memchat_cleanup;

grant select (id) on table memchat.memories to memchat_cleanup;

grant select (user_id) on table memchat.memories to memchat_cleanup;

revoke all on function memchat.keep_memories() from public;

revoke all on function memchat.memories_save(uuid[],text,bigint[],integer[],text[],text[],text[]) from public;

grant execute on function memchat.memories_save(uuid[],text,bigint[],integer[],text[],text[],text[]) to memchat_worker;

revoke all on function memchat.search_memories(text,extensions.vector,text,text,integer,double precision,boolean) from public;

grant execute on function memchat.search_memories(text,extensions.vector,text,text,integer,double precision,boolean) to memchat_user;

comment on column memchat.memories.expires_at is 'Null while the session lives; set when the cleanup deletes the session.';

comment on table memchat.forgotten_memories is 'The (message, ordinal) of each memory its user deleted, never written again.';

comment on table memchat.memories is 'Durable memory: the facts each message stated, with their date and session; outlives the transcript by MEMORY_RETENTION_DAYS (supabase/schemas/tables/memories.sql).';
