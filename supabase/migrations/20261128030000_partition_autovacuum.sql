-- Autovacuum leaves a small recall-key partition alone until thousands of
-- its rows have changed (issue 22).
--
-- memchat.recall's plans are generic (migration *_key_partitions.sql): each
-- holds all 32 partitions of memchat.message_embeddings and
-- memchat.message_facts, so an analysis or a vacuum of any one partition
-- (both record new statistics in pg_class) throws away every cached recall
-- plan in every connection, and the next recall of each plans again over all
-- 64 partitions. Autovacuum's defaults analyse a table after 50 + 10% of its
-- rows have changed and vacuum it after 1,000 + 20% inserted. That suits
-- one table; a 32nd of a young deployment's keys crosses 50 rows with every
-- user's import, so autovacuum analysed some twenty partitions of each table
-- a minute, one after the other, while LongMemEval's questions were asked,
-- and the searches that met one of those rounds took 17-25 ms instead of
-- about 7 (docs/benchmarks.md, "Recall plans kept while the partitions are
-- young").
--
-- Here a partition is analysed after 5,000 + 10% of its rows have changed
-- and vacuumed for inserts after 20,000 + 20%. Large partitions are not
-- affected (their 10% is past 5,000 once they hold 50,000 keys). A young
-- partition's statistics are at most 5,000 rows behind. Never analysed, it
-- has none: memchat.rarer_words then keeps every query word (the rounds
-- ranked are at most the caller's, under 5,000 in a partition that young)
-- and memchat.recall judges the HNSW path by the caller's messages alone.
-- Vacuums for dead rows (deleted or updated keys) keep autovacuum's default.
--
-- Storage parameters are the partitions' own (a partitioned table has none to
-- inherit): a migration that partitions these tables again sets them again.

do $$
declare
  v_partition pg_catalog.regclass;
begin
  for v_partition in
    select i.inhrelid::pg_catalog.regclass
      from pg_catalog.pg_inherits i
     where i.inhparent in ('memchat.message_embeddings'::pg_catalog.regclass,
                           'memchat.message_facts'::pg_catalog.regclass)
  loop
    execute pg_catalog.format(
      'alter table %s set (autovacuum_analyze_threshold = 5000,'
      ' autovacuum_vacuum_insert_threshold = 20000)', v_partition);
  end loop;
end
$$;
