-- The backfill analyses a young recall-key partition once it has doubled
-- since its statistics (issue 22).
--
-- Autovacuum analyses a recall-key partition after 5,000 + 10% of its rows
-- have changed (migration *_partition_autovacuum.sql, which keeps cached
-- recall plans from being thrown away by analyses of young partitions). So a
-- young deployment's partitions go unanalysed until they hold 5,000 keys. A
-- user who imports a long history into one of them gets slow searches until
-- then: memchat.rarer_words finds no common words to leave out of the word
-- list, and memchat.recall judges the HNSW path without the partition's
-- size. Measured through the API (POST /sessions/import of LongMemEval
-- haystacks for one user, the backfill done, 100 searches of GET
-- /memory/search; docs/benchmarks.md, "Recall right after a large import"):
-- median 8.1 ms with about 1,000 keys in the partition, 11.2 ms with 2,400
-- and 16.5-18.5 ms with 4,800, against 6.4, 5.9 and 5.7 ms once
-- memchat.message_embeddings' partition was analysed. Analysing
-- chat_message_history and chat_sessions changed nothing.
--
-- memchat.embedding_statistics(leases) is called by the backfill after each
-- round, before the round's sessions are settled: the recall-key partitions
-- of the leases' owners (memchat.message_embeddings' and its
-- memchat.message_facts sibling) are analysed where they hold at least
-- 1,000 keys and never were, or twice as many keys as their statistics
-- count. Partitions whose statistics count 5,000 keys or more are left to
-- autovacuum, whose threshold then comes first. Each partition is analysed
-- at most a few times in its life (1,000, 2,000, 4,000 keys...), always by
-- a bulk writer, so cached plans are thrown away rarely; a partition of a
-- few hundred keys (a short history each) is not analysed at all.
--
-- The keys are counted, not read from the cumulative statistics: those lag
-- the worker's last writes by up to a second or more. The count stops at
-- the number that decides (at most 10,000 keys read).
create function memchat.embedding_statistics(p_leases uuid[]) returns integer
language plpgsql
security definer
set search_path = ''
as $$
declare
  v_owner uuid;
  v_keys pg_catalog.regclass;
  v_counted real;
  v_enough bigint;
  v_present bigint;
  v_analysed integer := 0;
begin
  for v_owner in
    select distinct on (memchat.key_partition(q.user_id)) q.user_id
      from memchat.embedding_queue q
     where q.lease = any(p_leases) and q.next_attempt_at > pg_catalog.now()
  loop
    v_keys := memchat.key_partition_of('message_embeddings', v_owner);
    continue when v_keys is null;
    -- -1: never analysed (nor vacuumed).
    select c.reltuples into v_counted from pg_catalog.pg_class c where c.oid = v_keys;
    continue when v_counted >= 5000;
    v_enough := greatest(2 * v_counted, 1000)::bigint;
    execute pg_catalog.format('select count(*) from (select from %s limit $1) k', v_keys)
       into v_present using v_enough;
    continue when v_present < v_enough;
    execute pg_catalog.format('analyze %s', v_keys);
    execute pg_catalog.format('analyze %s',
                              memchat.key_partition_of('message_facts', v_owner));
    v_analysed := v_analysed + 1;
  end loop;
  return v_analysed;
end
$$;

revoke all on function memchat.embedding_statistics(uuid[]) from public;
grant execute on function memchat.embedding_statistics(uuid[]) to memchat_worker;
