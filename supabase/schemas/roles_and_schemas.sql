-- The roles memchat adds to Supabase's, its schemas, and pgvector.
--
-- Who can do what (docs/deploy.md, "Roles", states it exactly; a test
-- compares that statement with the catalog):
-- * `authenticated` is the web app through Supabase's Data API (PostgREST):
--   it reads its own rows, deletes its own sessions and upserts its own
--   active-session pointer. Nothing else: no messages, no notes, no expiry.
-- * `memchat_api` is the API functions' login role. It holds no rights of its
--   own (NOINHERIT): every request switches, in its one transaction, to
--   `memchat_user`, so a code path that forgets the switch is refused.
-- * `memchat_user` carries the API's write grants and policies. It is a
--   member of `authenticated`, so it reads exactly as the Data API does and
--   `auth.uid()` works for it on Supabase too (custom roles cannot be given
--   the `auth` schema there; its members can).
-- * `memchat_cleanup` is the TTL cleanup's login role: it sees and deletes
--   expired sessions only, and reads no message content.
-- * `memchat_worker` is the summary worker's and the embedding backfill's
--   login role: it is no member of `memchat_user` and acts only on what a
--   queue hands it, through SECURITY DEFINER functions that take the lease
--   of a claimed queue item.
-- * `memchat_analyst` reads the operator's analytics views
--   (memchat_analytics) and nothing else: no table, no text a user wrote.
-- Roles are created without passwords; docs/deploy.md says how to set them.
-- Roles, their memberships and settings are the server's, not the
-- database's: made if missing, whoever made them.

do $$
begin
  if not exists (select 1 from pg_roles where rolname = 'memchat_user') then
    create role memchat_user nologin inherit;
  end if;
  if not exists (select 1 from pg_roles where rolname = 'memchat_api') then
    create role memchat_api login noinherit;
  end if;
  if not exists (select 1 from pg_roles where rolname = 'memchat_cleanup') then
    create role memchat_cleanup login noinherit;
  end if;
  if not exists (select 1 from pg_roles where rolname = 'memchat_worker') then
    create role memchat_worker login noinherit;
  end if;
  if not exists (select 1 from pg_roles where rolname = 'memchat_analyst') then
    create role memchat_analyst nologin noinherit;
  end if;
end
$$;

grant authenticated to memchat_user;
grant memchat_user to memchat_api;

-- What one statement or one open transaction may hold at most, whatever the
-- code does. The API also sets its own (DB_STATEMENT_TIMEOUT_MS,
-- DB_IDLE_IN_TRANSACTION_TIMEOUT_MS) in every request's transaction; these
-- are the floor under a code path that forgets. Through Supavisor, role
-- settings apply to the server connections it opens as the role.
alter role memchat_api set statement_timeout = '30s';
alter role memchat_api set idle_in_transaction_session_timeout = '60s';
alter role memchat_worker set statement_timeout = '30s';
alter role memchat_worker set idle_in_transaction_session_timeout = '60s';
-- The cleanup's batches are bounded by CLEANUP_BATCH_SIZE and lock_timeout.
alter role memchat_cleanup set statement_timeout = '120s';
alter role memchat_cleanup set idle_in_transaction_session_timeout = '60s';

-- Private helpers and tables live outside `public`, so the Data API never
-- exposes them.
create schema if not exists memchat;

-- The operator's views across all users. Not among the Data API's exposed
-- schemas; only `memchat_analyst` (and the owner) may use it (grants.sql).
create schema memchat_analytics;

-- pgvector, where Supabase keeps extensions (infra/bootstrap.sql makes the
-- same schema on plain PostgreSQL).
create extension if not exists vector with schema extensions;
