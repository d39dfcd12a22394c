-- Every unique key of a user's table holds user_id (supabase/schemas/tables:
-- messages.sql, notes.sql, feedback.sql, recall_keys.sql, queues.sql), as a
-- table distributed by user_id needs (Citus: docs/deploy.md). Each leads
-- with the column it led with before, so lookups by it alone keep their
-- index. Re-runnable: a key already in shape is left as it is.

do $$
declare
  v record;
begin
  for v in
    select * from (values
      ('public', 'chat_message_history', 'id'),
      ('public', 'agent_long_term_memory', 'id'),
      ('memchat', 'message_feedback', 'message_id'),
      ('memchat', 'message_facts_made', 'message_id')) as t(schema_name, table_name, lead)
  loop
    if (select pg_get_constraintdef(c.oid) from pg_constraint c
         where c.conrelid = format('%I.%I', v.schema_name, v.table_name)::regclass
           and c.contype = 'p')
       is distinct from format('PRIMARY KEY (%s, user_id)', v.lead) then
      execute format('alter table %I.%I drop constraint if exists %I,'
                     ' add constraint %I primary key (%I, user_id)',
                     v.schema_name, v.table_name, v.table_name || '_pkey',
                     v.table_name || '_pkey', v.lead);
    end if;
  end loop;
end
$$;

-- The queues are small: their lease indexes are made again.
drop index if exists memchat.summary_queue_lease_idx;
create unique index summary_queue_lease_idx on memchat.summary_queue (lease, user_id)
  where lease is not null;
drop index if exists memchat.embedding_queue_lease_idx;
create unique index embedding_queue_lease_idx on memchat.embedding_queue (lease, user_id)
  where lease is not null;

-- memchat.facts_save marks a message made by its new key (functions/embeddings.sql).
set local check_function_bodies = off;

CREATE OR REPLACE FUNCTION memchat.facts_save(p_done_leases uuid[], p_done bigint[], p_model text, p_ids bigint[], p_ordinals integer[], p_embeddings text[])
 RETURNS integer
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO ''
AS $function$
declare
  v_done bigint[];
  v_owners uuid[];
  v_marked integer;
begin
  select array_agg(e.message_id), array_agg(distinct e.user_id) into v_done, v_owners
    from unnest(p_done_leases, p_done) as x(lease, id)
    join memchat.embedding_queue q on q.lease = x.lease and q.next_attempt_at > now()
    join memchat.message_embeddings e
      on e.message_id = x.id and e.user_id = q.user_id and e.session_id = q.session_id
   where e.model = p_model;
  if v_done is null then
    return 0;
  end if;
  delete from memchat.message_facts f where f.message_id = any(v_done) and f.user_id = any(v_owners);
  insert into memchat.message_facts
      (message_id, ordinal, user_id, session_id, agent_name, created_at, model, embedding)
  select e.message_id, x.ordinal, e.user_id, e.session_id, e.agent_name, e.created_at, p_model,
         x.embedding::extensions.vector
    from unnest(p_ids, p_ordinals, p_embeddings) as x(id, ordinal, embedding)
    join memchat.message_embeddings e on e.message_id = x.id
   where e.message_id = any(v_done) and e.user_id = any(v_owners);
  insert into memchat.message_facts_made as m (message_id, user_id, model)
  select e.message_id, e.user_id, p_model
    from memchat.message_embeddings e
   where e.message_id = any(v_done) and e.user_id = any(v_owners)
  on conflict (message_id, user_id) do update set model = excluded.model;
  get diagnostics v_marked = row_count;
  return v_marked;
end
$function$;
