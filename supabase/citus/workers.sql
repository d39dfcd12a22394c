-- The workers' functions on Citus. On plain PostgreSQL a claim locks the due
-- items it takes and passes over those another worker holds (FOR UPDATE
-- SKIP LOCKED: supabase/schemas/functions/summaries.sql, embeddings.sql);
-- Citus runs no FOR UPDATE across shards. Here the due items are read
-- without a lock, then each is taken by an update of its own row (routed
-- to its user's shard) that holds only while the item is still due: an
-- item another worker took meanwhile is no longer due once that claim
-- commits, and the update passes it over. Each lease is the md5 of a
-- random salt drawn once per claim and the item's session (Citus refuses a
-- volatile function in a distributed UPDATE, and any but an immutable one
-- in its RETURNING). Applied by `memchat db
-- distribute` (memchat.store.distribute) after the tables are distributed,
-- and again by every later run (`memchat migrate` runs it after any migration
-- on a distributed database).

-- Lease up to p_limit due items of the queue memchat.<p_queue> for
-- p_lease_seconds: [{"lease", "session_id", "attempts"}]. The owner's,
-- called by the two claims below.
create or replace function memchat.claim_due(
  p_queue text, p_limit integer, p_lease_seconds double precision
) returns jsonb
language plpgsql
set search_path = ''
as $$
declare
  v_salt text := gen_random_uuid()::text;
  v_due record;
  v_leased jsonb := '[]'::jsonb;
  v_lease uuid;
  v_attempts integer;
begin
  for v_due in execute format(
    'select d.session_id, d.user_id from memchat.%I d'
    ' where d.next_attempt_at <= now() order by d.next_attempt_at limit $1', p_queue)
    using p_limit
  loop
    execute format(
      'update memchat.%I q'
      '   set next_attempt_at = now() + make_interval(secs => $1),'
      '       lease = md5($2 || q.session_id::text)::uuid'
      ' where q.session_id = $3 and q.user_id = $4 and q.next_attempt_at <= now()'
      ' returning q.lease, q.attempts', p_queue)
      into v_lease, v_attempts
      using p_lease_seconds, v_salt, v_due.session_id, v_due.user_id;
    if v_lease is not null then
      v_leased := v_leased || jsonb_build_array(jsonb_build_object(
        'lease', v_lease, 'session_id', v_due.session_id, 'attempts', v_attempts));
    end if;
  end loop;
  return v_leased;
end
$$;
revoke all on function memchat.claim_due(text, integer, double precision) from public;

create or replace function memchat.summary_claim(p_limit integer, p_lease_seconds double precision)
returns jsonb
language plpgsql
security definer
set search_path = ''
as $$
begin
  return memchat.claim_due('summary_queue', p_limit, p_lease_seconds);
end
$$;

create or replace function memchat.embedding_claim(p_limit integer, p_lease_seconds double precision)
returns jsonb
language plpgsql
security definer
set search_path = ''
as $$
begin
  return memchat.claim_due('embedding_queue', p_limit, p_lease_seconds);
end
$$;

-- The backfill's statistics step reads every key partition across the
-- shards, then writes the reference tables of the word statistics: Citus
-- does both over one connection per node only when told to.
alter function memchat.embedding_statistics() set citus.multi_shard_modify_mode = 'sequential';
