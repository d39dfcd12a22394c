-- The limits every writer is held to, whoever writes (the triggers of
-- triggers.sql, functions/limits.sql). One row: raise a limit with
-- `update memchat.limits set ...` (the API's own settings must stay within
-- these; see docs/deploy.md).
create table memchat.limits (
  singleton boolean primary key default true check (singleton),
  -- A user message's text (the API's MAX_MESSAGE_CHARS): what a new turn may
  -- send to the model.
  max_message_chars integer not null default 16000 check (max_message_chars > 0),
  -- Any stored message as JSON: answers, tool calls and results included.
  max_message_bytes integer not null default 262144 check (max_message_bytes >= 1024),
  -- The long-term notes of one (user, agent) (the API's LTM_MAX_CHARS).
  max_notes_chars integer not null default 8000 check (max_notes_chars > 0),
  -- How far ahead a session's expires_at may be set (SESSION_TTL_HOURS).
  max_session_ttl interval not null default interval '168 hours'
    check (max_session_ttl > interval '0'),
  -- How many versions of each (user, agent)'s notes are kept (tables/notes.sql).
  notes_versions_kept integer not null default 20
    check (notes_versions_kept between 1 and 1000),
  -- The most messages a user's live sessions may hold
  -- (USER_MAX_STORED_MESSAGES; functions/limits.sql).
  max_stored_messages bigint not null default 100000 check (max_stored_messages >= 1),
  -- An imported message's text (IMPORT_MAX_MESSAGE_CHARS): it is only
  -- stored, never sent to the model as a new turn is, so it may be longer.
  max_import_message_chars integer not null default 200000
    check (max_import_message_chars >= 1)
);
comment on table memchat.limits is
  'Limits every writer is held to (triggers on the user tables). One row.';
insert into memchat.limits default values;
