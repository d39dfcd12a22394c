-- Which partition of the recall keys (memchat.message_embeddings,
-- memchat.message_facts: tables/recall_keys.sql) holds a user's rows.
--
-- The keys are hash-partitioned by user_id, so that a caller's HNSW scan
-- walks its partition's graph, where other users' keys are a 32nd of the
-- table's, instead of finding the caller's keys among everyone's
-- (docs/benchmarks.md). Every statement that names the caller (user_id =
-- ...) reads one partition: the planner prunes the others (for a
-- parameter, when the plan starts). Statements that know only message ids
-- (the cascades of deleted messages, functions/cleanup.sql) go to each
-- partition directly, as a delete by ids alone would probe all 32 primary
-- keys per id.
--
-- The number of partitions is fixed. The aim is a partition of a few
-- hundred thousand keys at most; a deployment far beyond 32 times that
-- would re-partition with a migration of its own (and set the partitions'
-- storage parameters again: tables/recall_keys.sql).

create function memchat.key_partitions() returns integer
language sql immutable parallel safe
set search_path = ''
as $$ select 32 $$;

-- The remainder of p_user_id's partition: PostgreSQL's own hash partitioning
-- of one uuid column (uuid_hash_extended with the partition seed, combined
-- with 0, modulo the partitions). Checked against PostgreSQL's routing when
-- the tables are made (tables/recall_keys.sql) and in
-- tests/store/test_recall_scale.py, so a server hashing otherwise fails
-- loudly instead of deleting from the wrong partition. 32 is a power of
-- two: the remainder is the low bits, which the sum keeps without overflow.
create function memchat.key_partition(p_user_id uuid) returns integer
language plpgsql immutable parallel safe
set search_path = ''
as $$
begin
  return (((pg_catalog.uuid_hash_extended(p_user_id, 8816678312871386365) & 31)
           + (x'49a0f4dd15e5a8e3'::bigint & 31)) & 31)::integer;
end
$$;

-- The name of p_user_id's partition of memchat.<p_table>.
create function memchat.key_partition_name(p_table text, p_user_id uuid) returns text
language plpgsql immutable parallel safe
set search_path = ''
as $$
begin
  return p_table || '_p' || pg_catalog.lpad(memchat.key_partition(p_user_id)::text, 2, '0');
end
$$;

-- The same as a relation (null when there is no such table).
create function memchat.key_partition_of(p_table text, p_user_id uuid) returns regclass
language plpgsql stable parallel safe
set search_path = ''
as $$
begin
  return pg_catalog.to_regclass('memchat.' || memchat.key_partition_name(p_table, p_user_id));
end
$$;
