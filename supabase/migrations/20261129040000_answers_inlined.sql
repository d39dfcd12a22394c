-- The answer a message got, written once and read by the planner in place
-- (issue 22).
--
-- memchat.recall_hits gave each hit its answer, its neighbours and their
-- answers by calling memchat.answer_of, a PL/pgSQL function: up to nine
-- calls per recall, each a statement of its own run through SPI. The rule
-- (the first assistant message after it in its session that is not a tool
-- call) is now memchat.answer_after, a plain SQL function returning a set:
-- read in FROM, the planner inlines it into the statement that reads it,
-- as it does memchat.nearest_messages, so recall_hits is one statement
-- again (bench_langgraph.py's data: recall 1.39 -> 1.34 ms median, the same
-- hits; docs/benchmarks.md). memchat.answer_of, which the round's words
-- (memchat.index_round) still read, returns the same through it.

-- The first assistant message after p_message_id in its session that is not
-- a tool call: its text. Not SECURITY DEFINER and without a search_path of
-- its own, so the planner inlines it (it names only built-in operators and
-- functions, which pg_catalog resolves first); under the caller's rights.
create function memchat.answer_after(p_user_id uuid, p_session_id uuid, p_message_id bigint)
returns table (content text)
language sql stable
as $$
  select x.message->'data'->>'content'
    from public.chat_message_history x
   where x.user_id = p_user_id and x.session_id = p_session_id and x.id > p_message_id
     and x.message->>'type' = 'ai'
     and coalesce(pg_catalog.jsonb_array_length(x.message->'data'->'tool_calls'), 0) = 0
   order by x.id
   limit 1
$$;
revoke all on function memchat.answer_after(uuid, uuid, bigint) from public;
grant execute on function memchat.answer_after(uuid, uuid, bigint) to memchat_user;

create or replace function memchat.answer_of(p_message_id bigint) returns text
language plpgsql stable
set search_path = ''
as $$
begin
  return (
    select a.content
      from public.chat_message_history h
      cross join lateral memchat.answer_after(h.user_id, h.session_id, h.id) a
     where h.id = p_message_id);
end
$$;

-- As in migration *_recall_hits.sql, the answers read in the same statement.
create or replace function memchat.recall_hits(
  p_ids bigint[],
  p_scores double precision[],
  p_session_id uuid,
  p_floor bigint
) returns jsonb
language plpgsql stable
set search_path = ''
as $$
begin
  return coalesce((
    select jsonb_agg(jsonb_build_object(
             'message_id', h.id,
             'session_id', h.session_id,
             'created_at', h.created_at,
             'score', hit.score,
             'title', s.title,
             'question', left(h.message->'data'->>'content', 2000),
             'answer', left(ha.content, 2000),
             'before', case when b.id is not null then jsonb_build_object(
               'message_id', b.id,
               'question', left(b.message->'data'->>'content', 1000),
               'answer', left(ba.content, 1000)) end,
             'after', case when a.id is not null then jsonb_build_object(
               'message_id', a.id,
               'question', left(a.message->'data'->>'content', 1000),
               'answer', left(aa.content, 1000)) end)
           order by hit.ord)
      from unnest(p_ids, p_scores) with ordinality as hit(id, score, ord)
      join public.chat_message_history h on h.id = hit.id
      join public.chat_sessions s on s.id = h.session_id and s.user_id = h.user_id
      left join lateral memchat.answer_after(h.user_id, h.session_id, h.id) ha on true
      -- The exchange before it in its session (its neighbour): what the hit
      -- often answers or goes on from.
      left join lateral (
           select x.id, x.message from public.chat_message_history x
            where x.user_id = h.user_id and x.session_id = h.session_id and x.id < h.id
              and memchat.embeddable(x.message)
            order by x.id desc limit 1) b on true
      left join lateral memchat.answer_after(h.user_id, h.session_id, b.id) ba on true
      -- The exchange after it: what often answers or corrects it. In the
      -- turn's session, not one of the window's (the prompt shows those).
      left join lateral (
           select x.id, x.message from public.chat_message_history x
            where x.user_id = h.user_id and x.session_id = h.session_id and x.id > h.id
              and (p_session_id is null or x.session_id <> p_session_id or x.id < p_floor)
              and memchat.embeddable(x.message)
            order by x.id limit 1) a on true
      left join lateral memchat.answer_after(h.user_id, h.session_id, a.id) aa on true),
    '[]'::jsonb);
end
$$;
