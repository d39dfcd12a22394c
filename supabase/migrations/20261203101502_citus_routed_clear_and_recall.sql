-- Written by `memchat db diff`: what supabase/schemas has that the
-- migrations before this one did not make:
--   function memchat.lock_clear_target(uuid,text)
--   function memchat.owned_rounds_matching(uuid,text,text,tsquery,tsquery,uuid,bigint,integer,bigint)
--   function memchat.recall_hits(bigint[],double precision[],uuid,bigint)
--   privileges on function memchat.lock_clear_target(uuid,text)

set local check_function_bodies = off;

CREATE OR REPLACE FUNCTION memchat.lock_clear_target(p_session_id uuid, p_agent_name text)
 RETURNS uuid
 LANGUAGE plpgsql
 SET search_path TO ''
AS $function$
declare
  v_uid uuid := auth.uid();
  v_id uuid;
  v_agent text;
begin
  select s.id, s.agent_name into v_id, v_agent
    from public.chat_sessions s
   where s.user_id = v_uid
     and s.id = coalesce(p_session_id,
         (select a.active_session_id from public.user_agent_active_sessions a
           where a.user_id = v_uid and a.agent_name = p_agent_name))
     for update;
  perform pg_catalog.set_config('memchat.clear_target', coalesce(v_id::text, ''), true);
  perform pg_catalog.set_config('memchat.clear_agent', coalesce(v_agent, ''), true);
  return v_id;
end
$function$;

CREATE OR REPLACE FUNCTION memchat.owned_rounds_matching(p_user_id uuid, p_agent_name text, p_model text, p_words tsquery, p_owned tsquery, p_session_id uuid, p_floor bigint, p_limit integer, p_rounds bigint)
 RETURNS bigint[]
 LANGUAGE plpgsql
 STABLE
 SET search_path TO ''
 SET enable_bitmapscan TO 'on'
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
begin
  -- Custom plans only where this function's own setting asks for them
  -- (Citus: `memchat db distribute`).
  perform pg_catalog.set_config(
    'plan_cache_mode',
    case when p_rounds > memchat.words_planned_from()
              or pg_catalog.current_setting('plan_cache_mode') = 'force_custom_plan'
         then 'force_custom_plan'
         else 'force_generic_plan' end,
    true);
  return (
    with matched as materialized (
      -- Each round's lexemes decompressed once (stored compressed in the
      -- row, they would be again at every test below).
      select e.message_id, e.lexemes operator(pg_catalog.||) ''::tsvector as lexemes,
             pg_catalog.length(e.lexemes) as size
        from memchat.message_embeddings e
        join public.chat_sessions s on s.id = e.session_id and s.user_id = e.user_id
       where e.user_id = p_user_id and e.agent_name = p_agent_name and e.model = p_model
         and s.status = 'active' and s.expires_at > pg_catalog.now()
         and (p_session_id is null or e.session_id <> p_session_id or e.message_id < p_floor)
         and e.lexemes operator(pg_catalog.@@) p_owned
    ), weighed as materialized (
      -- Each word of p_words (tsquery's output quotes it), its weight, and
      -- the matched rounds' mean length.
      select d.word,
             pg_catalog.ln(1 + (greatest(p_rounds, d.matched) - d.rounds + 0.5) / (d.rounds + 0.5))
               as idf,
             d.size
        from (select w.word,
                     count(*) filter (where m.lexemes operator(pg_catalog.@@) w.word) as rounds,
                     count(*) as matched, greatest(avg(m.size), 1) as size
                from (select distinct ('''' || l[1] || '''')::tsquery as word
                        from pg_catalog.regexp_matches(p_words::text, '''((?:[^'']|'''')+)''', 'g')
                             l) w
               cross join matched m
               group by w.word) d
    )
    select coalesce(array_agg(r.message_id order by r.score desc, r.message_id desc), '{}')
      from (select m.message_id,
                   sum(w.idf) * 2.2 / (1 + 1.2 * (0.6 + 0.4 * m.size / min(w.size))) as score
              from matched m
              join weighed w on m.lexemes operator(pg_catalog.@@) w.word
             group by m.message_id, m.size
             order by 2 desc, 1 desc
             limit p_limit) r);
end
$function$;

CREATE OR REPLACE FUNCTION memchat.recall_hits(p_ids bigint[], p_scores double precision[], p_session_id uuid, p_floor bigint)
 RETURNS jsonb
 LANGUAGE plpgsql
 STABLE
 SET search_path TO ''
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
             'answer', left(case when memchat.asked(h.message) then ha.content
                                 else h.message->'data'->>'content' end, 2000),
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
              and memchat.asked(x.message)
            order by x.id desc limit 1) b on true
      left join lateral memchat.answer_after(h.user_id, h.session_id, b.id) ba on true
      -- The exchange after it: what often answers or corrects it. In the
      -- turn's session, not one of the window's (the prompt shows those).
      left join lateral (
           select x.id, x.message from public.chat_message_history x
            where x.user_id = h.user_id and x.session_id = h.session_id and x.id > h.id
              and (p_session_id is null or x.session_id <> p_session_id or x.id < p_floor)
              and memchat.asked(x.message)
            order by x.id limit 1) a on true
      left join lateral memchat.answer_after(h.user_id, h.session_id, a.id) aa on true
     where h.user_id = v_uid),
    '[]'::jsonb);
end
$function$;

revoke all on function memchat.lock_clear_target(uuid,text) from public;

grant execute on function memchat.lock_clear_target(uuid,text) to memchat_user;
