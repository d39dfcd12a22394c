-- Written by `memchat db diff`: what supabase/schemas has that the
-- migrations before this one did not make:
--   function memchat.begin_request(text,integer,integer,integer)
--   privileges on function memchat.begin_request(text,integer,integer,integer)

set local check_function_bodies = off;

CREATE OR REPLACE FUNCTION memchat.begin_request(p_claims text, p_statement_timeout_ms integer, p_idle_timeout_ms integer, p_max_stored_messages integer)
 RETURNS void
 LANGUAGE plpgsql
 SET search_path TO ''
AS $function$
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
$function$;

revoke all on function memchat.begin_request(text,integer,integer,integer) from public;

grant execute on function memchat.begin_request(text,integer,integer,integer) to memchat_user;
