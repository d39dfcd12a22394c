-- What the API's requests call in their own transaction: the caller's
-- claims, whether the caller still exists, and the throttles
-- (tables/throttles.sql).

-- The caller's verified claims and the request's limits, for the rest of the
-- transaction, called as `memchat_user` right after `set local role`
-- (memchat.store.db). Supabase's auth.uid() and auth.role() read the legacy
-- per-claim settings first: they are set here too, so a value left on a
-- pooled server connection can never stand in for the caller. SET LOCAL, not
-- set_config(): on Citus (citus.propagate_set_commands = 'local', which
-- `memchat db distribute` gives the API's role) a transaction block's SET
-- LOCAL is repeated on every worker the transaction reaches, so RLS on the
-- shards sees the caller; set_config() stays on the coordinator. Only the
-- function's own search_path is undone when it returns.
create function memchat.begin_request(
  p_claims text, p_statement_timeout_ms integer, p_idle_timeout_ms integer,
  p_max_stored_messages integer
) returns void
language plpgsql
set search_path = ''
as $$
declare
  v_claims jsonb := p_claims::jsonb;
begin
  execute pg_catalog.format('set local request.jwt.claims = %L', p_claims);
  execute pg_catalog.format('set local request.jwt.claim.sub = %L',
                            coalesce(v_claims ->> 'sub', ''));
  execute pg_catalog.format('set local request.jwt.claim.role = %L',
                            coalesce(v_claims ->> 'role', ''));
  set local request.jwt.claim = '';
  execute pg_catalog.format('set local statement_timeout = %s', p_statement_timeout_ms);
  execute pg_catalog.format('set local idle_in_transaction_session_timeout = %s',
                            p_idle_timeout_ms);
  execute pg_catalog.format('set local memchat.max_stored_messages = %s',
                            p_max_stored_messages);
  set local timezone = 'UTC';
end
$$;

-- Whether the caller of this request still exists (a deleted user's token
-- is refused). SECURITY DEFINER: the API's role cannot read auth.users.
create function memchat.current_user_exists() returns boolean
language plpgsql stable security definer
set search_path = ''
as $$
begin
  return exists (select 1 from auth.users u where u.id = (select auth.uid()));
end
$$;

-- Takes a token from the caller's bucket; returns 0 if it got one, else the
-- seconds until one is available (and takes nothing). Concurrent requests of
-- one user queue on the bucket's row for the rest of their transaction.
create function memchat.take_rate_token(
  p_bucket text, p_per_minute double precision, p_burst integer
) returns double precision
language plpgsql
set search_path = ''
as $$
declare
  v_uid uuid := auth.uid();
  -- now() itself next to a column in an UPDATE: refused by Citus.
  v_now timestamptz := now();
  v_level double precision;
begin
  if p_per_minute <= 0 or not memchat.current_user_exists() then
    -- A deleted user's request is refused anyway (its transaction's
    -- existence check); it keeps no bucket.
    return 0;
  end if;
  insert into memchat.rate_buckets (user_id, bucket, tokens, refilled_at)
  values (v_uid, p_bucket, p_burst, v_now)
  on conflict (user_id, bucket) do nothing;
  select least(p_burst::double precision,
               r.tokens + greatest(0, extract(epoch from v_now - r.refilled_at))
                          * p_per_minute / 60)
    into v_level
    from memchat.rate_buckets r where r.user_id = v_uid and r.bucket = p_bucket
     for update;
  if v_level < 1 then
    return (1 - v_level) * 60 / p_per_minute;
  end if;
  update memchat.rate_buckets r
     set tokens = v_level - 1, refilled_at = greatest(r.refilled_at, v_now)
   where r.user_id = v_uid and r.bucket = p_bucket;
  return 0;
end
$$;

-- take_rate_token for any request's transaction: out of tokens raises
-- SQLSTATE MC429 (DETAIL: the seconds to wait), so the request's other
-- statements, sent in the same pipeline, never run.
create function memchat.throttle(p_bucket text, p_per_minute double precision, p_burst integer)
returns void
language plpgsql
set search_path = ''
as $$
declare
  v_retry double precision := memchat.take_rate_token(p_bucket, p_per_minute, p_burst);
begin
  if v_retry > 0 then
    raise exception 'rate limited (%)', p_bucket
      using errcode = 'MC429', detail = v_retry::text;
  end if;
end
$$;
