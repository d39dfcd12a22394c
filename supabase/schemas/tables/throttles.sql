-- Per-user throttles and the turns being answered. Row-level security,
-- privileges: policies.sql, grants.sql; using them: functions/requests.sql,
-- functions/turns.sql.

-- A token bucket per (user, bucket): refilled continuously at the bucket's
-- rate, capped at its burst; each throttled request takes one token. The
-- rates are the API's settings (memchat/throttle.py says which request uses
-- which bucket). Kept when the user's data is deleted (DELETE /me), so
-- deleting cannot reset a throttle; gone with the user (auth.users). A
-- bucket untouched for a day is full again for any sane rate: the cleanup
-- deletes it (it would be made again full).
create table memchat.rate_buckets (
  user_id uuid not null references auth.users (id) on delete cascade,
  bucket text not null check (bucket ~ '^[a-z_]{1,32}$'),
  tokens double precision not null,
  refilled_at timestamptz not null,
  primary key (user_id, bucket)
);
comment on table memchat.rate_buckets is
  'Per-user throttles (token buckets), one row per (user, bucket). Outlive DELETE /me.';

-- A chat turn with a client_message_id claims the key while the model
-- answers, so concurrent retries wait for the stored answer instead of
-- calling the model again. The turn's record deletes the claim; a failed
-- turn releases it; a crashed one expires (and the cleanup deletes it).
create table memchat.turn_claims (
  user_id uuid not null references auth.users (id) on delete cascade,
  client_message_id text not null check (char_length(client_message_id) between 1 and 128),
  message_digest bytea not null,
  expires_at timestamptz not null,
  primary key (user_id, client_message_id)
);
