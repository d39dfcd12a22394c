-- The word list reads the caller's own rounds only (issue 22): every
-- round's lexemes also hold its owner's lexeme, and memchat.rounds_matching
-- asks the GIN index for rounds holding it and one of the query's words.
--
-- Until now the index gave every round of every user holding one of the
-- words, and the caller's were picked out of them afterwards: a word that
-- 300 of the caller's rounds hold is in 300 rounds of each other user with a
-- history like theirs, so the list's cost grew with the number of users (on
-- the LongMemEval database, 4.4 ms median and 14 ms p95 with 180 users,
-- against 1.3 and 2.8 ms this way: docs/benchmarks.md). With the owner's
-- lexeme in the query, GIN walks the owner's entry (the caller's rounds) and
-- skips through the words' entries to them, so what one search reads follows
-- the caller's history alone, however many users share the table.
--
-- The owner's lexeme is 'user ', a space, and the user id's 32 hex digits.
-- A parser splits words at spaces: no lexeme made from anyone's text, and
-- no query's, holds one, so none matches or ranks it. It is not a guard:
-- rounds_matching still filters on auth.uid() itself.

create function memchat.owner_lexeme(p_user_id uuid) returns text
language sql immutable parallel safe
set search_path = ''
as $$ select 'user ' || pg_catalog.replace(p_user_id::text, '-', '') $$;

-- A round's lexemes with its owner's: what message_embeddings.lexemes holds.
create function memchat.owned_lexemes(p_lexemes tsvector, p_user_id uuid) returns tsvector
language sql immutable parallel safe
set search_path = ''
as $$
  select coalesce(p_lexemes, ''::tsvector)
         operator(pg_catalog.||) pg_catalog.array_to_tsvector(array[memchat.owner_lexeme(p_user_id)])
$$;

comment on column memchat.message_embeddings.lexemes is
  'The full-text lexemes of the message''s round: its text (weight A), its answer''s (B), '
  'and its owner''s lexeme (memchat.owner_lexeme), so that the GIN index finds one user''s rounds.';

-- As in migration *_hybrid_recall.sql, with the owner's lexeme.
create or replace function memchat.index_round() returns trigger
language plpgsql
set search_path = ''
as $$
declare
  v_text text;
begin
  select h.message->'data'->>'content',
         memchat.owned_lexemes(
           memchat.round_lexemes(h.message->'data'->>'content', memchat.answer_of(h.id)),
           new.user_id)
    into v_text, new.lexemes
    from public.chat_message_history h
   where h.id = new.message_id;
  if memchat.says_several_things(v_text) then
    new.facts_model := null;
    -- The backfill adds the fact keys (a given-up session is ready again).
    insert into memchat.embedding_queue as q (session_id, user_id)
    values (new.session_id, new.user_id)
    on conflict (session_id, user_id) do update set attempts = 0, next_attempt_at = now()
     where q.next_attempt_at = 'infinity';
  else
    new.facts_model := new.model;
  end if;
  return new;
end
$$;

-- The rounds stored so far (the GIN index follows the update).
update memchat.message_embeddings set lexemes = memchat.owned_lexemes(lexemes, user_id);

-- The owner's rounds of one agent and model in live sessions, outside the
-- window, whose lexemes match p_owned (the owner's lexeme and p_words),
-- best first by their rank for p_words: memchat.rounds_matching's list.
-- Its own function so that the query is a parameter, known when the
-- statement is planned: the planner reads the words' frequencies (GIN for a
-- long history, the owner index for a short one) and tests a row against a
-- value, not an expression made again for every row. Not executable by
-- users: it trusts p_user_id.
create function memchat.owned_rounds_matching(
  p_user_id uuid, p_agent_name text, p_model text, p_words tsquery, p_owned tsquery,
  p_session_id uuid, p_floor bigint, p_limit integer
) returns bigint[]
language sql stable
set search_path = ''
set enable_bitmapscan = on
as $$
  select coalesce(array_agg(m.message_id order by m.rank desc, m.message_id desc), '{}')
    from (select e.message_id, ts_rank(e.lexemes, p_words, 1) as rank
            from memchat.message_embeddings e
            join public.chat_sessions s on s.id = e.session_id and s.user_id = e.user_id
           where e.user_id = p_user_id and e.agent_name = p_agent_name and e.model = p_model
             and s.status = 'active' and s.expires_at > pg_catalog.now()
             and (p_session_id is null or e.session_id <> p_session_id or e.message_id < p_floor)
             and e.lexemes operator(pg_catalog.@@) p_owned
           order by 2 desc, 1 desc
           limit p_limit) m
$$;
revoke all on function memchat.owned_rounds_matching(uuid, text, text, tsquery, tsquery, uuid,
                                                     bigint, integer) from public;

-- As in migration *_recall_at_scale.sql (the caller's rows only, by the
-- verified claims' auth.uid(); none without claims), through the owner's
-- lexeme.
create or replace function memchat.rounds_matching(
  p_agent_name text, p_model text, p_words tsquery, p_session_id uuid, p_floor bigint,
  p_limit integer
) returns bigint[]
language sql stable security definer
set search_path = ''
as $$
  -- Without a user (claims without `sub`) both are null: no row matches.
  select memchat.owned_rounds_matching(
           auth.uid(), p_agent_name, p_model, p_words,
           pg_catalog.quote_literal(memchat.owner_lexeme(auth.uid()))::tsquery
             operator(pg_catalog.&&) p_words,
           p_session_id, p_floor, p_limit)
$$;

-- Called by memchat.index_round, which runs as whoever inserts the embedding
-- (a turn: the caller; the backfill: the owner), and by rounds_matching.
revoke all on function memchat.owner_lexeme(uuid), memchat.owned_lexemes(tsvector, uuid)
  from public;
grant execute on function memchat.owner_lexeme(uuid), memchat.owned_lexemes(tsvector, uuid)
  to memchat_user;
