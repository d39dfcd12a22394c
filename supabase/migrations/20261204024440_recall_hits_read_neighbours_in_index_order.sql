-- Written by `memchat db diff`: what supabase/schemas has that the
-- migrations before this one did not make:
--   function memchat.recall_hits(bigint[],double precision[],uuid,bigint)

set local check_function_bodies = off;

CREATE OR REPLACE FUNCTION memchat.recall_hits(p_ids bigint[], p_scores double precision[], p_session_id uuid, p_floor bigint)
 RETURNS jsonb
 LANGUAGE plpgsql
 STABLE
 SET search_path TO ''
 SET enable_seqscan TO 'off'
 SET enable_sort TO 'off'
AS $function$
declare
  -- The caller, a parameter of the statement: on Citus, its shard.
  v_uid uuid := auth.uid();
begin
  return coalesce((
    select jsonb_agg(jsonb_build_object(
             'message_id', h.id,
             'session_id', h.session_id,
             'created_at', h.created_at,
             'score', hit.score,
             'title', s.title,
             'question', case when memchat.asked(h.message)
                              then left(h.message->'data'->>'content', 2000) else '' end,
             'answer', left(case when memchat.asked(h.message) then answers.of[1]
                                 else h.message->'data'->>'content' end, 2000),
             'before', case when b.id is not null then jsonb_build_object(
               'message_id', b.id,
               'question', left(b.message->'data'->>'content', 1000),
               'answer', left(answers.of[2], 1000)) end,
             'after', case when a.id is not null then jsonb_build_object(
               'message_id', a.id,
               'question', left(a.message->'data'->>'content', 1000),
               'answer', left(answers.of[3], 1000)) end)
           order by hit.ord)
      from unnest(p_ids, p_scores) with ordinality as hit(id, score, ord)
      join public.chat_message_history h on h.id = hit.id and h.user_id = v_uid
      join public.chat_sessions s on s.id = h.session_id and s.user_id = v_uid
      -- The exchange before it in its session (its neighbour): what the hit
      -- often answers or goes on from.
      left join lateral (
           select x.id, x.message from public.chat_message_history x
            where x.user_id = v_uid and x.session_id = h.session_id and x.id < h.id
              and memchat.asked(x.message)
            order by x.id desc limit 1) b on true
      -- The exchange after it: what often answers or corrects it. In the
      -- turn's session, not one of the window's (the prompt shows those).
      left join lateral (
           select x.id, x.message from public.chat_message_history x
            where x.user_id = v_uid and x.session_id = h.session_id and x.id > h.id
              and (p_session_id is null or x.session_id <> p_session_id or x.id < p_floor)
              and memchat.asked(x.message)
            order by x.id limit 1) a on true
      -- The answers to the hit, to the exchange before it and to the one
      -- after it, in that order (null: none, or no such exchange): the
      -- assistant's messages with text after each up to the next user
      -- message, as memchat.answer_after reads them. The next question is
      -- a value of the join, so that the answers are one range of the
      -- window index (user_id, session_id, id) between the two questions;
      -- the range is read under the window index's own condition (offset 0),
      -- so that no index over every answer of the user's (the digests')
      -- is read instead, whatever the statistics say.
      cross join lateral (
           select array_agg(y.content order by q.n) as of
             from unnest(array[h.id, b.id, a.id]) with ordinality q(id, n)
             -- The next question after it in its session (none: its end).
             left join lateral (
                  select coalesce((select n.id from public.chat_message_history n
                                    where n.user_id = v_uid and n.session_id = h.session_id
                                      and n.id > q.id and memchat.asked(n.message)
                                    order by n.id
                                    limit 1), 9223372036854775807) as id) nx on true
             left join lateral (
                  select pg_catalog.string_agg(x.message->'data'->>'content', E'\n\n'
                                               order by x.id) as content
                    from (select x.id, x.message
                            from public.chat_message_history x
                           where x.user_id = v_uid and x.session_id = h.session_id
                             and x.id > q.id and x.id < nx.id
                             and x.message->>'type' <> 'tool'
                             and coalesce(jsonb_array_length(x.message->'data'->'tool_calls'), 0) = 0
                          offset 0) x
                   where x.message->>'type' = 'ai' and memchat.embeddable(x.message)
                  having pg_catalog.count(*) > 0) y on true) answers
     where h.user_id = v_uid),
    '[]'::jsonb);
end
$function$;
