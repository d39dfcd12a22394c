-- Written by `memchat db diff`: what supabase/schemas has that the
-- migrations before this one did not make:
--   function memchat.take_rate_token(text,double precision,integer)
--   privileges on column public.chat_sessions.message_count

set local check_function_bodies = off;

CREATE OR REPLACE FUNCTION memchat.take_rate_token(p_bucket text, p_per_minute double precision, p_burst integer)
 RETURNS double precision
 LANGUAGE plpgsql
 SET search_path TO ''
AS $function$
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
$function$;

grant select (message_count) on table public.chat_sessions to memchat_cleanup;
