-- Young recall-key partitions are analysed once per backfill run, every
-- partition looked at, whoever grew it (issue 22).
--
-- memchat.embedding_statistics(leases) analysed the key partitions of a
-- backfill round's owners after each round (migration
-- *_young_partition_statistics.sql): an import's. A partition also grows by
-- turns, each storing its user message's embedding; young, it waits for
-- autovacuum's 5,000 changed rows with no statistics, and a user with a long
-- history in it gets the slow recall measured there (11.2 ms median at 2,400
-- keys against 5.9 analysed). memchat.embedding_statistics() now looks at
-- every partition, and the worker calls it once at the end of each run
-- (usecases/backfill.py; the summary function's schedule, 5 minutes by
-- default), after its rounds: an import's partitions are analysed before
-- the run ends, as before, and those grown by turns by the next run.
-- Partitions counted 5,000 or more are passed over at the cost of reading
-- pg_class, so a grown deployment pays nothing; a young one counts at most
-- twice each partition's last counted keys.
drop function memchat.embedding_statistics(uuid[]);

create function memchat.embedding_statistics() returns integer
language plpgsql
security definer
set search_path = ''
as $$
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
    execute pg_catalog.format('select count(*) from (select from %s limit $1) k', v_keys)
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
  return v_analysed;
end
$$;

revoke all on function memchat.embedding_statistics() from public;
grant execute on function memchat.embedding_statistics() to memchat_worker;
