-- The secret of the operator's analytics pseudonyms (views.sql). Only its
-- owner reads it: row-level security with no policy (policies.sql) and no
-- grant (grants.sql).
--
-- A user's pseudonym is HMAC-SHA256 of the user id (uuid_send's 16 bytes)
-- under this secret; a session's, of the user id's and the session id's
-- bytes (32 bytes). The HMAC is built from core sha256(): the embedded
-- PostgreSQL has no pgcrypto, and on Supabase pgcrypto's
-- `extensions.hmac(uuid_send(id), secret, 'sha256')` gives the same bytes.
-- Rotate the secret (old and new pseudonyms then no longer match) with:
--   update memchat.analytics_key set secret = default, rotated_at = default;
create table memchat.analytics_key (
  singleton boolean primary key default true check (singleton),
  -- 32 random bytes: three v4 uuids (122 random bits each, from the
  -- server's strong random source) hashed together; core functions only.
  secret bytea not null
    default sha256(uuid_send(gen_random_uuid()) || uuid_send(gen_random_uuid())
                   || uuid_send(gen_random_uuid()))
    check (octet_length(secret) between 32 and 64),
  inner_pad bytea generated always as (memchat.analytics_key_pad(secret, 54)) stored,
  outer_pad bytea generated always as (memchat.analytics_key_pad(secret, 92)) stored,
  rotated_at timestamptz not null default now()
);
comment on table memchat.analytics_key is
  'The secret of the analytics pseudonyms (HMAC-SHA256 key); readable by the owner only.'
  ' Rotate: update memchat.analytics_key set secret = default, rotated_at = default;';
insert into memchat.analytics_key default values;
