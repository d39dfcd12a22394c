-- The operator's analytics, across all users (docs/analytics.md says what
-- each column means), without anything a user wrote.
--
-- * The views run with their owner's rights (security_invoker = false; the
--   owner is the role that applies the schema, which owns the tables:
--   `postgres` on Supabase), so reading them needs select on the view only
--   (grants.sql: `memchat_analyst`'s only rights), and what they expose is
--   all that reader gets: counts, token usage, latencies, ratings, timings,
--   model and agent names, and a pseudonymised user id. No text a user
--   wrote, no message, session or user id.
-- * The pseudonyms are HMAC-SHA256 under the secret of memchat.analytics_key
--   (tables/analytics_key.sql), which only the owner can read.
-- * The views are security barriers: a function in a reader's where clause
--   is not run on rows a view filters out before the view has filtered them.
-- Joins between messages and sessions match the session id and the user id
-- (session ids are unique per user only).

-- Every turn with its user's and session's ids, for the owner's views only:
-- the aggregates count distinct raw ids (cheaper than hashing every row),
-- and only memchat_analytics.turns, which hashes them, is shown. A turn is
-- its final answer: an assistant message without tool calls. Its session is
-- a left join on the session's whole key (id and user): a message's session
-- always exists (its foreign key), and a view that reads no session column
-- (daily_active_users, daily_usage) then skips the join altogether instead
-- of looking up a session per answer.
create view memchat.analytics_turns as
select h.session_id,
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
  left join public.chat_sessions s on s.id = h.session_id and s.user_id = h.user_id
 where h.message->>'type' = 'ai'
   and coalesce(jsonb_array_length(h.message->'data'->'tool_calls'), 0) = 0;

-- The pads as scalar subqueries: each is read once per query (an InitPlan),
-- and the key's one row does not enter the join, or its estimates.
create view memchat_analytics.turns
  with (security_invoker = false, security_barrier = true) as
select encode(sha256((select k.outer_pad from memchat.analytics_key k)
                     || sha256((select k.inner_pad from memchat.analytics_key k)
                               || uuid_send(t.user_id))),
              'hex') as user_pseudonym,
       encode(sha256((select k.outer_pad from memchat.analytics_key k)
                     || sha256((select k.inner_pad from memchat.analytics_key k)
                               || uuid_send(t.user_id) || uuid_send(t.session_id))),
              'hex') as session_pseudonym,
       t.agent_name, t.created_at, t.day, t.model, t.prompt_tokens, t.completion_tokens,
       t.latency_ms, t.recalled, t.summary_used
  from memchat.analytics_turns t;
comment on view memchat_analytics.turns is
  'One row per stored turn: pseudonymised user and session, agent, model, tokens, latency,'
  ' memory use. No text, no ids.';

create view memchat_analytics.daily_active_users
  with (security_invoker = false, security_barrier = true) as
select t.day, count(distinct t.user_id) as users, count(*) as turns
  from memchat.analytics_turns t
 group by t.day;

create view memchat_analytics.daily_usage
  with (security_invoker = false, security_barrier = true) as
select t.day, t.model, count(*) as turns, count(distinct t.user_id) as users,
       sum(t.prompt_tokens) as prompt_tokens, sum(t.completion_tokens) as completion_tokens,
       round(avg(t.latency_ms)::numeric, 1) as avg_latency_ms,
       round((percentile_cont(0.95) within group (order by t.latency_ms))::numeric, 1)
         as p95_latency_ms
  from memchat.analytics_turns t
 group by t.day, t.model;

-- How many ratings carry a comment, never the comment.
create view memchat_analytics.daily_feedback
  with (security_invoker = false, security_barrier = true) as
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

create view memchat_analytics.session_lengths
  with (security_invoker = false, security_barrier = true) as
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

create view memchat_analytics.daily_memory_use
  with (security_invoker = false, security_barrier = true) as
select t.day, t.agent_name, count(*) as turns,
       count(*) filter (where t.recalled > 0) as turns_with_recall,
       sum(t.recalled) as exchanges_recalled,
       count(*) filter (where t.summary_used) as turns_with_summary,
       round(avg((t.recalled > 0)::int)::numeric, 3) as recall_rate,
       round(avg(t.summary_used::int)::numeric, 3) as summary_rate
  from memchat.analytics_turns t
 group by t.day, t.agent_name;
