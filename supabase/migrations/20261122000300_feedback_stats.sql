-- Feedback, usage and stats (issue 13).
--
-- * Each session keeps counters of its turns and their tokens (record_turn
--   adds to them, from the usage its assistant messages carry), so a user's
--   stats read their sessions' rows, never their messages.
-- * memchat.message_feedback: one rating (-1, 0, 1) and an optional comment
--   per assistant answer, the caller's own only (RLS); deleted with its
--   message (clear-session, delete-me, the TTL cleanup) by the foreign key.
-- * memchat.chat_stats / memchat.session_stats: a user's stats in one
--   statement each, as the caller (security invoker, RLS).
-- * memchat_analytics: the operator's views across all users, readable by
--   `memchat_analyst` (and the project's owner) only; the Data API never
--   exposes the schema, and `authenticated` and `anon` have no usage on it.

-- ------------------------------------------------------------ counters
alter table public.chat_sessions
  add column turn_count integer not null default 0 check (turn_count >= 0),
  add column prompt_tokens bigint not null default 0 check (prompt_tokens >= 0),
  add column completion_tokens bigint not null default 0 check (completion_tokens >= 0);
comment on column public.chat_sessions.turn_count is
  'Turns answered in this session (kept when it is cleared; restarts when it expires).';
comment on column public.chat_sessions.prompt_tokens is
  'Prompt tokens the model billed for this session''s turns (kept when it is cleared).';
comment on column public.chat_sessions.completion_tokens is
  'Completion tokens the model billed for this session''s turns (kept when it is cleared).';

-- Sessions stored before this migration: their turns and tokens, once.
update public.chat_sessions s
   set turn_count = c.turns, prompt_tokens = c.prompt, completion_tokens = c.completion
  from (select h.session_id,
               count(*) filter (where h.message->>'type' = 'human') as turns,
               coalesce(sum((h.message->'data'->'usage_metadata'->>'input_tokens')::bigint), 0)
                 as prompt,
               coalesce(sum((h.message->'data'->'usage_metadata'->>'output_tokens')::bigint), 0)
                 as completion
          from public.chat_message_history h
         group by h.session_id) c
 where c.session_id = s.id;

-- ------------------------------------------------------------ feedback
create table memchat.message_feedback (
  message_id bigint primary key
    references public.chat_message_history (id) on delete cascade,
  user_id uuid not null default auth.uid() references auth.users (id) on delete cascade,
  session_id uuid not null references public.chat_sessions (id) on delete cascade,
  agent_name text not null,
  rating smallint not null check (rating in (-1, 0, 1)),
  comment text check (comment is null or char_length(comment) <= 2000),
  created_at timestamptz not null default now(),
  updated_at timestamptz not null default now()
);
comment on table memchat.message_feedback is
  'A user''s rating of one assistant answer: -1, 0 or 1, and an optional comment.';
create index message_feedback_user_idx on memchat.message_feedback (user_id, agent_name);
create index message_feedback_session_idx on memchat.message_feedback (session_id);

alter table memchat.message_feedback enable row level security;
revoke all on memchat.message_feedback from public;
grant select, insert, update, delete on memchat.message_feedback to memchat_user;
-- A rating is of one of the caller's own messages, in its own session.
create policy message_feedback_own on memchat.message_feedback for all to memchat_user
  using (user_id = (select auth.uid()))
  with check (user_id = (select auth.uid()) and exists (
    select 1 from public.chat_message_history h
     where h.id = message_feedback.message_id and h.session_id = message_feedback.session_id
       and h.user_id = (select auth.uid())));

-- ------------------------------------------------------------ the turn
-- load_context, as before; a replay carries the ids of the stored messages.
create or replace function memchat.load_context(
  p_session_id uuid,
  p_agent_name text,
  p_window integer,
  p_read_notes boolean,
  p_client_message_id text,
  p_message text,
  p_rate_per_minute double precision,
  p_rate_burst integer,
  p_claim_seconds double precision
) returns jsonb
language plpgsql
set search_path = ''
set enable_bitmapscan = off
as $$
declare
  v_uid uuid := auth.uid();
  v_session public.chat_sessions;
  v_session_json jsonb;
  v_notes jsonb;
  v_messages jsonb := '[]'::jsonb;
  v_floor bigint;
  v_summary jsonb;
  v_stored text;
  v_replay jsonb;
  v_same boolean;
  v_retry double precision;
  v_digest bytea;
begin
  if p_session_id is not null then
    select s.* into v_session from public.chat_sessions s where s.id = p_session_id;
    if v_session.id is null and memchat.session_id_taken(p_session_id) then
      return jsonb_build_object('taken', true);
    end if;
  else
    select s.* into v_session
      from public.user_agent_active_sessions a
      join public.chat_sessions s on s.id = a.active_session_id
     where a.user_id = v_uid and a.agent_name = p_agent_name
       and s.status = 'active' and s.expires_at > now();
  end if;
  if v_session.id is not null then
    v_session_json := to_jsonb(v_session)
      || jsonb_build_object('expired', v_session.expires_at <= now());
  end if;

  if p_client_message_id is not null then
    if v_session.id is not null then
      select u.message->'data'->>'content',
             case when a.id is not null then jsonb_build_object(
               'message', a.message, 'message_id', a.id, 'user_message_id', u.id) end
        into v_stored, v_replay
        from public.chat_message_history u
        left join lateral (
             select x.id, x.message from public.chat_message_history x
              where x.session_id = u.session_id and x.id > u.id
                and x.message->>'type' = 'ai'
                and coalesce(jsonb_array_length(x.message->'data'->'tool_calls'), 0) = 0
              order by x.id limit 1) a on true
       where u.session_id = v_session.id and u.client_message_id = p_client_message_id;
      if found then
        if v_stored is distinct from p_message then
          return jsonb_build_object('idempotency', 'conflict');
        end if;
        if v_replay is not null then
          return jsonb_build_object('taken', false, 'session', v_session_json,
                                    'replay', v_replay);
        end if;
      end if;
    end if;
    v_digest := sha256(convert_to(coalesce(p_message, ''), 'UTF8'));
    select c.message_digest = v_digest into v_same
      from memchat.turn_claims c
     where c.user_id = v_uid and c.client_message_id = p_client_message_id
       and c.expires_at > now();
    if found then
      return jsonb_build_object('idempotency', case when v_same then 'in_flight' else 'conflict' end);
    end if;
  end if;

  if p_rate_per_minute > 0 or p_client_message_id is not null then
    -- What this transaction writes (a throttle token, a turn claim) may be
    -- lost in a server crash without harm, so its commit does not wait for
    -- the WAL flush: the turn's first round trip stays a read's.
    perform set_config('synchronous_commit', 'off', true);
  end if;

  if p_rate_per_minute > 0 then
    v_retry := memchat.take_chat_token(p_rate_per_minute, p_rate_burst);
    if v_retry > 0 then
      return jsonb_build_object('throttled', v_retry);
    end if;
  end if;

  if p_client_message_id is not null then
    insert into memchat.turn_claims as c (user_id, client_message_id, message_digest, expires_at)
    values (v_uid, p_client_message_id, v_digest,
            now() + make_interval(secs => p_claim_seconds))
    on conflict (user_id, client_message_id) do update
       set message_digest = excluded.message_digest, expires_at = excluded.expires_at
     where c.expires_at <= now()
    returning true into v_same;
    if v_same is null then
      -- A concurrent request claimed it first (its row was not yet visible).
      return jsonb_build_object('idempotency', 'in_flight');
    end if;
  end if;

  if p_read_notes then
    select jsonb_build_object('notes', m.notes, 'version', m.version, 'updated_at', m.updated_at)
      into v_notes
      from public.agent_long_term_memory m
     where m.user_id = v_uid and m.agent_name = coalesce(v_session.agent_name, p_agent_name);
  end if;

  if v_session.id is not null and v_session.expires_at > now() then
    -- Walks chat_message_history_window_idx and stops after p_window entries.
    select coalesce(jsonb_agg(w.message order by w.id), '[]'::jsonb), min(w.id)
      into v_messages, v_floor
      from (select h.id, h.message from public.chat_message_history h
             where h.user_id = v_uid and h.session_id = v_session.id
               and h.message->>'type' <> 'tool'
               and coalesce(jsonb_array_length(h.message->'data'->'tool_calls'), 0) = 0
             order by h.id desc
             limit p_window) w;
    -- The summary, unless a conversational message lies between it and the window.
    if v_session.summary is not null and p_read_notes and not exists (
         select 1 from public.chat_message_history h
          where h.user_id = v_uid and h.session_id = v_session.id
            and h.id > v_session.summary_covers_until and h.id < v_floor
            and h.message->>'type' <> 'tool'
            and coalesce(jsonb_array_length(h.message->'data'->'tool_calls'), 0) = 0) then
      v_summary := jsonb_build_object(
        'text', v_session.summary,
        'covers_until', v_session.summary_covers_until,
        'updated_at', v_session.summary_updated_at);
    end if;
  end if;

  return jsonb_build_object(
    'taken', false,
    'session', v_session_json,
    'notes', v_notes,
    'messages', v_messages,
    'summary', v_summary,
    'replay', null,
    'claimed', p_client_message_id is not null,
    'limits', (select jsonb_build_object(
                 'max_message_chars', l.max_message_chars,
                 'max_notes_chars', l.max_notes_chars,
                 'max_session_ttl_seconds', extract(epoch from l.max_session_ttl))
                 from memchat.limits l));
end
$$;

-- record_turn, as before, and: the session's turn and token counters; it
-- returns the ids of the messages it stored (`message_ids`).
create or replace function memchat.record_turn(
  p_session_id uuid,
  p_agent_name text,
  p_title text,
  p_messages jsonb,
  p_ttl interval,
  p_client_message_id text,
  p_notes text,
  p_notes_version integer,
  p_new_session boolean,
  p_embedding extensions.vector,
  p_due_after integer
) returns jsonb
language plpgsql
set search_path = ''
as $$
declare
  v_uid uuid := auth.uid();
  v_count integer := jsonb_array_length(p_messages);
  v_session public.chat_sessions;
  v_expired boolean;
  v_active uuid;
  v_ids bigint[];
  v_prompt bigint;
  v_completion bigint;
begin
  -- The turn's token usage: what its assistant messages carry (LangChain's
  -- usage_metadata; the final answer holds the whole turn's).
  select coalesce(sum((m->'data'->'usage_metadata'->>'input_tokens')::bigint), 0),
         coalesce(sum((m->'data'->'usage_metadata'->>'output_tokens')::bigint), 0)
    into v_prompt, v_completion
    from jsonb_array_elements(p_messages) m
   where m->>'type' = 'ai' and jsonb_typeof(m->'data'->'usage_metadata') = 'object';

  if p_new_session then
    -- Serialises the first turns of one (user, agent); the lock ends with
    -- the transaction, so it is safe behind a transaction-mode pooler.
    perform pg_advisory_xact_lock(
      hashtextextended('memchat.new_session/' || v_uid::text || '/' || p_agent_name, 0));
    select s.id into v_active
      from public.user_agent_active_sessions a
      join public.chat_sessions s on s.id = a.active_session_id
     where a.user_id = v_uid and a.agent_name = p_agent_name
       and s.status = 'active' and s.expires_at > now();
    p_session_id := coalesce(v_active, p_session_id);
  end if;

  select s.expires_at <= now() into v_expired
    from public.chat_sessions s where s.id = p_session_id for update;
  if v_expired then
    delete from public.chat_message_history h where h.session_id = p_session_id;
  end if;

  insert into public.chat_sessions as s
      (id, user_id, agent_name, title, message_count, last_active_at, expires_at,
       turn_count, prompt_tokens, completion_tokens)
  values (p_session_id, v_uid, p_agent_name, p_title, v_count, now(),
          memchat.session_expiry(p_ttl), 1, v_prompt, v_completion)
  on conflict (id) do update set
      message_count = case when s.expires_at <= now() then excluded.message_count
                           else s.message_count + excluded.message_count end,
      turn_count = case when s.expires_at <= now() then 1 else s.turn_count + 1 end,
      prompt_tokens = case when s.expires_at <= now() then excluded.prompt_tokens
                           else s.prompt_tokens + excluded.prompt_tokens end,
      completion_tokens = case when s.expires_at <= now() then excluded.completion_tokens
                               else s.completion_tokens + excluded.completion_tokens end,
      summary = case when s.expires_at <= now() then null else s.summary end,
      summary_covers_until =
        case when s.expires_at <= now() then null else s.summary_covers_until end,
      summary_covers_count =
        case when s.expires_at <= now() then 0 else s.summary_covers_count end,
      summary_updated_at =
        case when s.expires_at <= now() then null else s.summary_updated_at end,
      title = coalesce(s.title, excluded.title),
      status = 'active',
      last_active_at = excluded.last_active_at,
      expires_at = excluded.expires_at
  returning s.* into v_session;

  with inserted as (
    insert into public.chat_message_history (session_id, user_id, message, client_message_id)
    select p_session_id, v_uid, m.message, case when m.ord = 1 then p_client_message_id end
      from jsonb_array_elements(p_messages) with ordinality as m(message, ord)
     order by m.ord
    returning id)
  select array_agg(i.id order by i.id) into v_ids from inserted i;

  -- The first message of a turn is the user's.
  if p_embedding is not null then
    insert into memchat.message_embeddings
        (message_id, user_id, session_id, agent_name, created_at, embedding)
    values (v_ids[1], v_uid, p_session_id, v_session.agent_name, now(), p_embedding);
  end if;

  insert into public.user_agent_active_sessions as a
      (user_id, agent_name, active_session_id, last_active_at)
  values (v_uid, v_session.agent_name, p_session_id, now())
  on conflict (user_id, agent_name) do update set
      active_session_id = excluded.active_session_id,
      last_active_at = excluded.last_active_at;

  if p_notes is not null then
    perform memchat.save_notes(v_session.agent_name, p_notes, p_notes_version);
  end if;

  if p_client_message_id is not null then
    delete from memchat.turn_claims c
     where c.user_id = v_uid and c.client_message_id = p_client_message_id;
  end if;

  if p_due_after is not null
     and v_session.message_count - v_session.summary_covers_count >= p_due_after then
    insert into memchat.summary_queue as q (session_id, user_id)
    values (p_session_id, v_uid)
    on conflict (session_id) do update set attempts = 0, next_attempt_at = now()
     where q.next_attempt_at = 'infinity';
  end if;

  -- The ids of the turn's messages, in order: the user's first, the answer last.
  return to_jsonb(v_session) || jsonb_build_object('message_ids', to_jsonb(v_ids));
end
$$;

-- ------------------------------------------------------------ stats
-- The caller's stats over their sessions of p_agent_name (all agents when
-- null): one scan of their sessions (the owner's index) and one of their
-- feedback, never of their messages.
create function memchat.chat_stats(p_agent_name text) returns jsonb
language sql stable
set search_path = ''
as $$
  with s as (
    select s.* from public.chat_sessions s
     where s.user_id = (select auth.uid())
       and (p_agent_name is null or s.agent_name = p_agent_name)),
  f as (
    select f.rating, f.comment from memchat.message_feedback f
     where f.user_id = (select auth.uid())
       and (p_agent_name is null or f.agent_name = p_agent_name))
  select jsonb_build_object(
    'agent_name', p_agent_name,
    'sessions', jsonb_build_object(
        'total', count(*),
        'active', count(*) filter (where s.status = 'active' and s.expires_at > now()),
        'cleared', count(*) filter (where s.status = 'cleared')),
    'messages', coalesce(sum(s.message_count), 0),
    'turns', coalesce(sum(s.turn_count), 0),
    'tokens', jsonb_build_object(
        'prompt', coalesce(sum(s.prompt_tokens), 0),
        'completion', coalesce(sum(s.completion_tokens), 0)),
    'feedback', (select jsonb_build_object(
        'positive', count(*) filter (where f.rating = 1),
        'negative', count(*) filter (where f.rating = -1),
        'neutral', count(*) filter (where f.rating = 0),
        'with_comment', count(*) filter (where f.comment is not null)) from f),
    'first_activity_at', min(s.created_at),
    'last_activity_at', max(s.last_active_at),
    'avg_messages_per_session', coalesce(round(avg(s.message_count), 2), 0))
  from s
$$;

-- The same for one of the caller's sessions (null if it is not theirs).
create function memchat.session_stats(p_session_id uuid) returns jsonb
language sql stable
set search_path = ''
as $$
  select jsonb_build_object(
    'session_id', s.id,
    'agent_name', s.agent_name,
    'status', case when s.status = 'active' and s.expires_at <= now() then 'expired'
                   else s.status end,
    'messages', s.message_count,
    'turns', s.turn_count,
    'tokens', jsonb_build_object('prompt', s.prompt_tokens, 'completion', s.completion_tokens),
    'feedback', (select jsonb_build_object(
        'positive', count(*) filter (where f.rating = 1),
        'negative', count(*) filter (where f.rating = -1),
        'neutral', count(*) filter (where f.rating = 0),
        'with_comment', count(*) filter (where f.comment is not null))
        from memchat.message_feedback f where f.session_id = s.id),
    'first_activity_at', s.created_at,
    'last_activity_at', s.last_active_at,
    'duration_seconds', round(extract(epoch from s.last_active_at - s.created_at)::numeric, 3))
  from public.chat_sessions s
  where s.id = p_session_id and s.user_id = (select auth.uid())
$$;

revoke all on function memchat.chat_stats(text), memchat.session_stats(uuid) from public;
grant execute on function memchat.chat_stats(text), memchat.session_stats(uuid)
  to memchat_user;

-- ------------------------------------------------------------ analytics
-- The operator's views, across all users. `security_invoker`: whoever reads
-- them needs the rights on the tables beneath, which only `memchat_analyst`
-- (policies below: read every row, write none) and the tables' owner (the
-- project's `postgres`, e.g. in Supabase's SQL editor) have. The schema is
-- not in the Data API's exposed schemas, and `anon`, `authenticated` and the
-- API's roles have no usage on it. docs/analytics.md says what each column
-- means.
do $$
begin
  if not exists (select 1 from pg_roles where rolname = 'memchat_analyst') then
    create role memchat_analyst nologin noinherit;
  end if;
end
$$;

create schema memchat_analytics;
revoke all on schema memchat_analytics from public;
grant usage on schema memchat_analytics to memchat_analyst;
grant usage on schema memchat to memchat_analyst;

grant select on public.chat_sessions, public.chat_message_history,
  memchat.message_feedback to memchat_analyst;
create policy chat_sessions_analyst on public.chat_sessions
  for select to memchat_analyst using (true);
create policy messages_analyst on public.chat_message_history
  for select to memchat_analyst using (true);
create policy message_feedback_analyst on memchat.message_feedback
  for select to memchat_analyst using (true);

-- A turn is its final answer: an assistant message without tool calls.
create view memchat_analytics.turns with (security_invoker = true) as
select h.id as message_id,
       h.session_id,
       h.user_id,
       s.agent_name,
       h.created_at,
       (h.created_at at time zone 'UTC')::date as day,
       coalesce(h.message->'data'->'response_metadata'->>'model_name', 'unknown') as model,
       coalesce((h.message->'data'->'usage_metadata'->>'input_tokens')::bigint, 0)
         as prompt_tokens,
       coalesce((h.message->'data'->'usage_metadata'->>'output_tokens')::bigint, 0)
         as completion_tokens,
       (h.message->'data'->'response_metadata'->>'latency_ms')::double precision as latency_ms,
       coalesce((h.message->'data'->'response_metadata'->'memchat'->>'recalled')::integer, 0)
         as recalled,
       coalesce((h.message->'data'->'response_metadata'->'memchat'->>'summary_used')::boolean,
                false) as summary_used
  from public.chat_message_history h
  join public.chat_sessions s on s.id = h.session_id
 where h.message->>'type' = 'ai'
   and coalesce(jsonb_array_length(h.message->'data'->'tool_calls'), 0) = 0;

create view memchat_analytics.daily_active_users with (security_invoker = true) as
select t.day, count(distinct t.user_id) as users, count(*) as turns
  from memchat_analytics.turns t
 group by t.day;

create view memchat_analytics.daily_usage with (security_invoker = true) as
select t.day, t.model, count(*) as turns, count(distinct t.user_id) as users,
       sum(t.prompt_tokens) as prompt_tokens, sum(t.completion_tokens) as completion_tokens,
       round(avg(t.latency_ms)::numeric, 1) as avg_latency_ms,
       round((percentile_cont(0.95) within group (order by t.latency_ms))::numeric, 1)
         as p95_latency_ms
  from memchat_analytics.turns t
 group by t.day, t.model;

create view memchat_analytics.daily_feedback with (security_invoker = true) as
select (f.updated_at at time zone 'UTC')::date as day, f.agent_name,
       count(*) as ratings,
       count(*) filter (where f.rating = 1) as positive,
       count(*) filter (where f.rating = -1) as negative,
       count(*) filter (where f.rating = 0) as neutral,
       count(*) filter (where f.comment is not null) as with_comment,
       round(avg((f.rating = 1)::int)::numeric, 3) as positive_rate,
       round(avg((f.rating = -1)::int)::numeric, 3) as negative_rate
  from memchat.message_feedback f
 group by 1, 2;

create view memchat_analytics.session_lengths with (security_invoker = true) as
select b.bucket, b.lower_bound, count(*) as sessions,
       round(avg(s.turn_count)::numeric, 1) as avg_turns,
       round(avg(extract(epoch from s.last_active_at - s.created_at))::numeric, 1)
         as avg_duration_seconds
  from public.chat_sessions s
  cross join lateral (
    select case when s.turn_count <= 1 then '1 turn'
                when s.turn_count <= 5 then '2-5 turns'
                when s.turn_count <= 20 then '6-20 turns'
                when s.turn_count <= 100 then '21-100 turns'
                else 'over 100 turns' end as bucket,
           case when s.turn_count <= 1 then 0
                when s.turn_count <= 5 then 2
                when s.turn_count <= 20 then 6
                when s.turn_count <= 100 then 21
                else 101 end as lower_bound) b
 where s.turn_count > 0
 group by b.bucket, b.lower_bound;

create view memchat_analytics.daily_memory_use with (security_invoker = true) as
select t.day, t.agent_name, count(*) as turns,
       count(*) filter (where t.recalled > 0) as turns_with_recall,
       sum(t.recalled) as exchanges_recalled,
       count(*) filter (where t.summary_used) as turns_with_summary,
       round(avg((t.recalled > 0)::int)::numeric, 3) as recall_rate,
       round(avg(t.summary_used::int)::numeric, 3) as summary_rate
  from memchat_analytics.turns t
 group by t.day, t.agent_name;

grant select on all tables in schema memchat_analytics to memchat_analyst;
-- Belt and braces: even with usage on the schema granted by mistake, the
-- Data API's roles could read none of the views.
revoke all on all tables in schema memchat_analytics from public, anon, authenticated;
