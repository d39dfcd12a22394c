-- Issue 22: a message's fact keys are marked made beside its embedding, not
-- in its row.
--
-- Until now the backfill marked the messages of each batch (all of them,
-- whether they had fact keys to make or not) by updating their
-- `message_embeddings` rows (facts_model := the model), right after
-- inserting them. Such a row carries the vector and the round's lexemes,
-- 3-4 KB, two to a page: the update could never stay on its page (no HOT
-- update), so every message the backfill embedded got a second row version
-- and a second entry in each of the table's indexes - the owner index, the
-- primary key, the lexemes' GIN index and the HNSW graph - which the
-- backfill paid to insert and a first search had to step over
-- (docs/benchmarks.md). A narrow row of its own says the same.
--
-- `facts_model` keeps its meaning where the row is inserted: the model, when
-- the message says one thing (no fact keys to make); null when the backfill
-- has fact keys to make. Those are made for model M when
-- `message_facts_made` holds (message, M); a new embedding of another model
-- (`memchat db reembed`) makes them due again, as before.

-- No foreign key (migration *_set_based_cascades.sql): a marker goes with
-- its message by the statement-level triggers below, and with its embedding
-- when `memchat db reembed` deletes embeddings of another size
-- (store.resize_embeddings).
create table memchat.message_facts_made (
  message_id bigint primary key,
  user_id uuid not null,
  model text not null
);
comment on table memchat.message_facts_made is
  'The model a message''s fact keys were made with (memchat.facts_save); see migration *_facts_made.sql.';

alter table memchat.message_facts_made enable row level security;
revoke all on memchat.message_facts_made from public, anon, authenticated, service_role;
-- The caller reads its own (memchat.embedding_backlog runs as the caller).
grant select on memchat.message_facts_made to memchat_user;
create policy message_facts_made_select on memchat.message_facts_made for select to memchat_user
  using (user_id = (select auth.uid()));

-- A message needs work for p_model (null: its own model) while it has no
-- embedding of that model, or its fact keys are due: it says several things
-- and they were not made with its embedding's model.
create or replace function memchat.unembedded_messages(
  p_user_id uuid, p_session_id uuid, p_model text
)
returns setof public.chat_message_history
language sql stable
as $$
  select h.* from public.chat_message_history h
   where h.user_id = p_user_id and h.session_id = p_session_id
     and memchat.embeddable(h.message)
     and not exists (select 1 from memchat.message_embeddings e
                      where e.message_id = h.id and (p_model is null or e.model = p_model)
                        and (e.facts_model is not distinct from e.model
                             or exists (select 1 from memchat.message_facts_made m
                                         where m.message_id = e.message_id
                                           and m.model = e.model)))
$$;

-- As in migration *_hybrid_recall.sql, but each message is marked made in
-- memchat.message_facts_made instead of by an update of its embedding's row.
create or replace function memchat.facts_save(
  p_done_leases uuid[], p_done bigint[], p_model text,
  p_ids bigint[], p_ordinals integer[], p_embeddings text[]
) returns integer
language plpgsql
security definer
set search_path = ''
as $$
declare
  v_done bigint[];
  v_marked integer;
begin
  select array_agg(e.message_id) into v_done
    from unnest(p_done_leases, p_done) as x(lease, id)
    join memchat.embedding_queue q on q.lease = x.lease and q.next_attempt_at > now()
    join memchat.message_embeddings e
      on e.message_id = x.id and e.user_id = q.user_id and e.session_id = q.session_id
   where e.model = p_model;
  if v_done is null then
    return 0;
  end if;
  delete from memchat.message_facts f where f.message_id = any(v_done);
  insert into memchat.message_facts
      (message_id, ordinal, user_id, session_id, agent_name, created_at, model, embedding)
  select e.message_id, x.ordinal, e.user_id, e.session_id, e.agent_name, e.created_at, p_model,
         x.embedding::extensions.vector
    from unnest(p_ids, p_ordinals, p_embeddings) as x(id, ordinal, embedding)
    join memchat.message_embeddings e on e.message_id = x.id
   where e.message_id = any(v_done);
  insert into memchat.message_facts_made as m (message_id, user_id, model)
  select e.message_id, e.user_id, p_model
    from memchat.message_embeddings e
   where e.message_id = any(v_done)
  on conflict (message_id) do update set model = excluded.model;
  get diagnostics v_marked = row_count;
  return v_marked;
end
$$;

-- As in migration *_hybrid_recall.sql, the markers too.
create or replace function memchat.delete_message_dependents() returns trigger
language plpgsql security definer
set search_path = ''
as $$
declare
  -- As an array, so each delete is a primary-key lookup per id whatever the
  -- statement's size (a transition table has no statistics to plan a join by).
  ids bigint[] := array(select g.id from gone g);
begin
  delete from memchat.message_embeddings e where e.message_id = any(ids);
  delete from memchat.message_facts f where f.message_id = any(ids);
  delete from memchat.message_facts_made m where m.message_id = any(ids);
  delete from memchat.message_feedback f where f.message_id = any(ids);
  perform set_config('memchat.deleted_messages',
    (coalesce(nullif(current_setting('memchat.deleted_messages', true), ''), '0')::bigint
     + cardinality(ids))::text, true);
  return null;
end
$$;

create or replace function memchat.truncate_message_dependents() returns trigger
language plpgsql security definer
set search_path = ''
as $$
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
  begin
    truncate memchat.message_feedback;
  exception when object_in_use then
    delete from memchat.message_feedback;
  end;
  return null;
end
$$;

-- The word list's GIN index without its pending list (fastupdate). With it,
-- new rounds' lexemes wait in one unsorted list, shared by every user,
-- until it passes gin_pending_list_limit (4 MB) or a vacuum merges it, and
-- every word-list query scans that whole list: after a LongMemEval run's
-- imports the word list took 2.11 ms median against 0.95 once vacuumed
-- (bench_recall_pieces.py, docs/benchmarks.md). Without it each round's
-- lexemes go into the index as the round is stored: a little more work per
-- stored embedding (the turn's record, the backfill), none per search.
alter index memchat.message_embeddings_lexemes_idx set (fastupdate = off);
select pg_catalog.gin_clean_pending_list('memchat.message_embeddings_lexemes_idx'::regclass);
