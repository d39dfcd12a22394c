-- Which session a chat front end's resent history belongs to, and that
-- history as memchat stored it (POST /v1/chat/completions without a
-- session or chat id; docs/api.md, "Which session").
--
-- A Chat Completions client resends its whole chat on every call. memchat
-- recognises the chat by the answers it stored: the session that holds the
-- client's last answer (after the same question) is the chat's, and the
-- window sent to the model is the client's earlier exchanges as memchat
-- stored them (each answer found by its text, after the same question, in
-- that session), never the client's copy and never another chat's messages
-- that happen to share the session. An answer is found by the digest of
-- its trimmed text, through an index of the user's final answers.

create index chat_message_history_answer_idx
  on public.chat_message_history
  (user_id, (decode(md5(btrim(message->'data'->>'content', E' \t\r\n')), 'hex')))
  where message->>'type' = 'ai'
    and coalesce(jsonb_array_length(message->'data'->'tool_calls'), 0) = 0;

-- p_questions, p_answers: the client's exchanges, oldest first (a question
-- may be null: an answer with no user message before it). Returns
-- {"session_id": the session holding the last answer after its question,
-- the newest such among the caller's live sessions of p_agent_name, or
-- null; "messages": that session's stored question and answer of each of
-- the last p_limit exchanges found in it, oldest first (LangChain's shape)}.
create function memchat.chat_of_history(
  p_agent_name text, p_questions text[], p_answers text[], p_limit integer
) returns jsonb
language plpgsql stable
set search_path = ''
as $$
declare
  v_uid uuid := auth.uid();
  v_last integer := cardinality(p_answers);
  v_session uuid;
  v_messages jsonb;
begin
  if v_last is null or v_last = 0 then
    return jsonb_build_object('session_id', null, 'messages', '[]'::jsonb);
  end if;
  select h.session_id into v_session
    from public.chat_message_history h
    join public.chat_sessions s on s.id = h.session_id and s.user_id = h.user_id
   where h.user_id = v_uid
     and decode(md5(btrim(h.message->'data'->>'content', E' \t\r\n')), 'hex')
         = decode(md5(btrim(p_answers[v_last], E' \t\r\n')), 'hex')
     and h.message->>'type' = 'ai'
     and coalesce(jsonb_array_length(h.message->'data'->'tool_calls'), 0) = 0
     and s.agent_name = p_agent_name and s.status = 'active' and s.expires_at > now()
     and (select q.message->'data'->>'content' from public.chat_message_history q
           where q.user_id = v_uid and q.session_id = h.session_id and q.id < h.id
             and q.message->>'type' = 'human'
           order by q.id desc limit 1) is not distinct from btrim(p_questions[v_last], E' \t\r\n')
   order by h.id desc
   limit 1;
  if v_session is null then
    return jsonb_build_object('session_id', null, 'messages', '[]'::jsonb);
  end if;

  -- Each exchange once: its answer's newest stored copy in the session.
  with given as (
    select g.question, decode(md5(btrim(g.answer, E' \t\r\n')), 'hex') as digest, g.ord
      from unnest(p_questions, p_answers) with ordinality as g(question, answer, ord)
     order by g.ord desc
     limit p_limit
  ), found as (
    select distinct on (a.id) a.id, a.message as answer, q.message as question, g.ord
      from given g
      join lateral (
        select h.id, h.message from public.chat_message_history h
         where h.user_id = v_uid and h.session_id = v_session
           and decode(md5(btrim(h.message->'data'->>'content', E' \t\r\n')), 'hex') = g.digest
           and h.message->>'type' = 'ai'
           and coalesce(jsonb_array_length(h.message->'data'->'tool_calls'), 0) = 0
         order by h.id desc
         limit 1) a on true
      left join lateral (
        select x.message from public.chat_message_history x
         where x.user_id = v_uid and x.session_id = v_session and x.id < a.id
           and x.message->>'type' = 'human'
         order by x.id desc
         limit 1) q on true
     where btrim(q.message->'data'->>'content', E' \t\r\n')
           is not distinct from btrim(g.question, E' \t\r\n')
     order by a.id, g.ord
  )
  select coalesce(jsonb_agg(m.message order by f.id, m.part), '[]'::jsonb) into v_messages
    from found f
    cross join lateral (values (1, f.question), (2, f.answer)) as m(part, message)
   where m.message is not null;
  return jsonb_build_object('session_id', v_session, 'messages', v_messages);
end
$$;

revoke all on function memchat.chat_of_history(text, text[], text[], integer) from public;
grant execute on function memchat.chat_of_history(text, text[], text[], integer) to memchat_user;
