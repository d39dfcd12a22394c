-- Recall's word list (memchat.recall, functions/recall.sql): the caller's
-- rounds holding the message's words, best first by BM25, found through
-- the GIN index of memchat.message_embeddings.lexemes
-- (tables/recall_keys.sql).
--
-- * A round's lexemes: its user message's (weight A) and its answers' (B),
--   filled when its embedding is stored, by whichever path stores it (a
--   turn, the backfill: trigger message_embeddings_index_round), and its
--   owner's lexeme, so that the GIN index finds one user's rounds: without
--   it the index gives every user's rounds holding a word, and the list's
--   cost grows with the number of users; with it, GIN walks the owner's
--   entry and skips through the words' entries to it.
-- * A long history searches with the message's rarer words only: its
--   commonest, by the statistics of the caller's partition, are left out
--   until the rounds expected to hold one of the rest fit
--   memchat.words_budget(). A common word's matches are many and say little
--   (what BM25's inverse document frequency says too), and ranking them
--   all is most of the list's cost (docs/benchmarks.md).

-- The words of a message as a query matching any of them: the message's
-- lexemes as Postgres indexes text (to_tsvector, English), each quoted for
-- tsquery's input, joined by |. A chat message is not search syntax: read
-- as a web search (websearch_to_tsquery), a hyphenated word became a phrase
-- of the compound and its parts, found only where the same compound is
-- written, and a minus before a word a negation that, ORed with the rest,
-- matched nearly every round. Here a hyphenated word gives the compound and
-- each part, quotes and minus signs are punctuation, "or" is a stop word.
-- Null: no words.
create function memchat.any_words(p_text text) returns tsquery
language plpgsql immutable parallel safe
set search_path = ''
as $$
begin
  return nullif(array_to_string(array(
           select '''' || replace(replace(l.lexeme, '\', '\\'), '''', '''''') || ''''
             from unnest(tsvector_to_array(to_tsvector('english'::regconfig, coalesce(p_text, ''))))
                  as l(lexeme)), ' | '), '')::tsquery;
end
$$;

-- A round's lexemes: the message's (weight A) and its answer's (B).
create function memchat.round_lexemes(p_question text, p_answer text) returns tsvector
language plpgsql immutable parallel safe
set search_path = ''
as $$
begin
  return setweight(to_tsvector('english'::regconfig, coalesce(left(p_question, 8000), '')), 'A')
      || setweight(to_tsvector('english'::regconfig, coalesce(left(p_answer, 8000), '')), 'B');
end
$$;

-- The owner's lexeme: 'user ', a space, and the user id's 32 hex digits. A
-- parser splits words at spaces: no lexeme made from anyone's text, and no
-- query's, holds one, so none matches or ranks it. It is not a guard:
-- memchat.rounds_matching still filters on auth.uid() itself.
create function memchat.owner_lexeme(p_user_id uuid) returns text
language plpgsql immutable parallel safe
set search_path = ''
as $$
begin
  return 'user ' || pg_catalog.replace(p_user_id::text, '-', '');
end
$$;

-- A round's lexemes with its owner's: what message_embeddings.lexemes holds.
create function memchat.owned_lexemes(p_lexemes tsvector, p_user_id uuid)
returns tsvector
language plpgsql immutable parallel safe
set search_path = ''
as $$
begin
  return coalesce(p_lexemes, ''::tsvector)
         operator(pg_catalog.||) pg_catalog.array_to_tsvector(array[memchat.owner_lexeme(p_user_id)]);
end
$$;

-- The trigger that fills a stored embedding's round (trigger
-- message_embeddings_index_round). A user message's: its lexemes, its fact
-- keys and memories due, and its session queued for them and its answer's
-- embedding (the backfill makes them, off the turn's path; a given-up
-- session is ready again). An
-- assistant message's: the exchange it is a key of (the last user message
-- before it in its session: memchat.asked), with no lexemes of its own (its
-- question's round holds them) and no fact keys; one that opens its session
-- is its own exchange, its text its round (weight B, as an answer's). Runs
-- as whoever inserts the embedding (a turn: the caller, under RLS; the
-- backfill: the owner, in its SECURITY DEFINER functions), with no grant of
-- its own.
create function memchat.index_round() returns trigger
language plpgsql
set search_path = ''
as $$
declare
  -- now() itself in ON CONFLICT DO UPDATE: refused by Citus (docs/deploy.md).
  v_now timestamptz := now();
  v_message jsonb;
  v_answer text;
begin
  -- Each read by the row's user_id too: on Citus, its own shard.
  select h.message into v_message
    from public.chat_message_history h
   where h.id = new.message_id and h.user_id = new.user_id;
  if v_message->>'type' = 'ai' then
    new.facts_model := new.model;
    new.exchange_id := (
      select x.id from public.chat_message_history x
       where x.user_id = new.user_id and x.session_id = new.session_id
         and x.id < new.message_id and memchat.asked(x.message)
       order by x.id desc
       limit 1);
    new.lexemes := case when new.exchange_id is null then memchat.owned_lexemes(
                     memchat.round_lexemes(null, v_message->'data'->>'content'), new.user_id) end;
    return new;
  end if;
  v_answer := (select a.content
                 from memchat.answer_after(new.user_id, new.session_id, new.message_id) a);
  new.exchange_id := null;
  new.lexemes := memchat.owned_lexemes(
    memchat.round_lexemes(v_message->'data'->>'content', v_answer), new.user_id);
  -- The backfill reads every user message once: its fact keys, and what
  -- durable memory keeps of it (functions/memories.sql).
  new.facts_model := null;
  insert into memchat.embedding_queue as q (session_id, user_id)
  values (new.session_id, new.user_id)
  on conflict (session_id, user_id) do update set attempts = 0, next_attempt_at = v_now
   where q.next_attempt_at = 'infinity';
  return new;
end
$$;

-- How many rounds the word list may expect to rank. The list recall fuses
-- is 20 deep; ranking many more rounds to choose those 20 is most of the
-- list's time, and the words a budget leaves out are the message's
-- commonest, whose matches the rarer words' already rank above
-- (docs/benchmarks.md).
create function memchat.words_budget() returns integer
language sql immutable parallel safe
set search_path = ''
as $$ select 100 $$;

-- A history of up to this many rounds keeps every word, whatever the
-- statistics of its partition: its recall does not depend on other users'
-- words or on when autovacuum ran, and ranking it whole costs less than the
-- budget allows for a longer one.
create function memchat.words_whole_rounds() returns integer
language sql immutable parallel safe
set search_path = ''
as $$ select 300 $$;

-- `p_words` without its commonest lexemes, for a caller with `p_rounds`
-- rounds: while the rounds expected to hold one of its lexemes (each
-- lexeme's share of the rows of the caller's partition times p_rounds; a
-- lexeme the statistics do not list counts at the least listed share)
-- exceed p_budget, the commonest goes; the rarest always stays, unless even
-- it alone is expected in more than ten budgets' rounds: then null, no word
-- list (recall ranks by meaning), as a common word's matches cannot tell 20
-- rounds apart. The shares come from the copy of the partition's
-- statistics (memchat.common_words) while it is the latest, else from
-- pg_stats. SECURITY DEFINER: pg_stats shows a table under row-level
-- security only to its owner, and the copy is the owner's; what leaves it
-- is which of the caller's own words are common.
create function memchat.rarer_words(p_words tsquery, p_rounds bigint, p_budget integer)
returns tsquery
language plpgsql stable security definer
set search_path = ''
as $$
declare
  v_name text := memchat.key_partition_name('message_embeddings', auth.uid());
  v_lexemes text[];
  v_shares real[];
  v_elems text[];
  v_listed real[];
  v_floor real;
  v_kept text[] := '{}';
  v_expected double precision := 0;
  v_lexeme record;
begin
  if p_words is null or p_rounds <= greatest(p_budget, memchat.words_whole_rounds()) then
    return p_words;
  end if;
  -- Each lexeme as the statistics spell it (tsquery's input doubles quotes).
  v_lexemes := array(select distinct l[1] from pg_catalog.regexp_matches(p_words::text, '''((?:[^'']|'''')+)''', 'g') l);
  select w.floor into v_floor
    from memchat.word_statistics w
   where w.partition_name = v_name
     and w.analysed_at >= memchat.last_analysed(pg_catalog.to_regclass('memchat.' || v_name));
  if found then
    -- The copy is the partition's latest statistics: its lexemes by key.
    v_shares := array(
      select coalesce(c.share, v_floor)
        from unnest(v_lexemes) with ordinality q(lexeme, n)
        left join memchat.common_words c
          on c.partition_name = v_name and c.lexeme = replace(q.lexeme, '''''', '''')
       order by q.n);
  else
    select s.most_common_elems::text::text[], s.most_common_elem_freqs
      into v_elems, v_listed
      from pg_catalog.pg_stats s
     where s.schemaname = 'memchat'
       and s.tablename = v_name
       and s.attname = 'lexemes';
    if v_elems is null then
      return p_words;  -- not analysed yet: every word
    end if;
    -- most_common_elem_freqs ends with the least and greatest listed share
    -- and the share of nulls.
    v_floor := v_listed[cardinality(v_elems) + 1];
    v_shares := array(
      select coalesce(f.share, v_floor)
        from unnest(v_lexemes) with ordinality q(lexeme, n)
        left join unnest(v_elems, v_listed[1:cardinality(v_elems)]) f(lexeme, share)
          on f.lexeme = replace(q.lexeme, '''''', '''')
       order by q.n);
  end if;
  for v_lexeme in
    select q.lexeme, q.share from unnest(v_lexemes, v_shares) q(lexeme, share) order by 2, 1
  loop
    exit when cardinality(v_kept) > 0 and v_expected + v_lexeme.share * p_rounds > p_budget;
    v_kept := v_kept || v_lexeme.lexeme;
    v_expected := v_expected + v_lexeme.share * p_rounds;
  end loop;
  if v_expected > 10 * p_budget then
    return null;  -- only the rarest word is kept, and it is common: no words
  end if;
  if cardinality(v_kept) = cardinality(v_lexemes) then
    return p_words;
  end if;
  return (select string_agg('''' || k || '''', ' | ') from unnest(v_kept) k)::tsquery;
end
$$;

-- A partition's last analysis as the cumulative statistics know it
-- (-infinity: none known, e.g. after they were reset).
create function memchat.last_analysed(p_partition regclass)
returns timestamptz
language plpgsql stable
set search_path = ''
as $$
begin
  return coalesce(greatest(pg_catalog.pg_stat_get_last_analyze_time(p_partition),
                           pg_catalog.pg_stat_get_last_autoanalyze_time(p_partition)),
                  '-infinity');
end
$$;

-- Copy the statistics of every recall-key partition analysed since its
-- copy (or never copied) into memchat.word_statistics and
-- memchat.common_words (tables/recall_keys.sql). The analysis time is read
-- before the statistics: an analysis that lands in between leaves the copy
-- older than the partition's last analysis, so it is not used, and the next
-- run copies again. Returns how many partitions were copied. Called by
-- memchat.embedding_statistics (functions/embeddings.sql).
create function memchat.copy_word_statistics() returns integer
language plpgsql
security definer
set search_path = ''
as $$
declare
  v_part record;
  v_at timestamptz;
  v_elems text[];
  v_shares real[];
  v_copied integer := 0;
begin
  for v_part in
    select i.inhrelid::pg_catalog.regclass as oid, c.relname::text as name, w.analysed_at
      from pg_catalog.pg_inherits i
      join pg_catalog.pg_class c on c.oid = i.inhrelid
      left join memchat.word_statistics w on w.partition_name = c.relname::text
     where i.inhparent = 'memchat.message_embeddings'::pg_catalog.regclass
     order by 2
  loop
    v_at := memchat.last_analysed(v_part.oid);
    -- Copied since its last analysis, or never analysed that we know of.
    continue when v_part.analysed_at >= v_at
               or (v_part.analysed_at is null and v_at = '-infinity');
    select s.most_common_elems::text::text[], s.most_common_elem_freqs
      into v_elems, v_shares
      from pg_catalog.pg_stats s
     where s.schemaname = 'memchat' and s.tablename = v_part.name and s.attname = 'lexemes';
    delete from memchat.word_statistics w where w.partition_name = v_part.name;
    if v_elems is not null then
      v_copied := v_copied + 1;
      -- most_common_elem_freqs ends with the least and greatest listed
      -- share and the share of nulls.
      insert into memchat.word_statistics (partition_name, analysed_at, floor)
      values (v_part.name, v_at, v_shares[cardinality(v_elems) + 1]);
      insert into memchat.common_words (partition_name, lexeme, share)
      select v_part.name, e.lexeme, e.share
        from unnest(v_elems, v_shares[1:cardinality(v_elems)]) e(lexeme, share);
    end if;
  end loop;
  return v_copied;
end
$$;

-- From how many rounds the word list is planned for its words: the owner
-- index's entries a generic plan may read grow with the history, a plan of
-- its own costs a planning.
create function memchat.words_planned_from() returns integer
language sql immutable parallel safe
set search_path = ''
as $$ select 2000 $$;

-- The owner's rounds of one agent and model in live sessions, outside the
-- window (message ids from p_floor on, in p_session_id), whose lexemes
-- match p_owned (the owner's lexeme and p_words), best first by BM25 over
-- them: each word of p_words a round holds is worth its inverse document
-- frequency among the owner's p_rounds rounds (the rounds holding it are
-- counted among those matched, which hold every one that does), the sum
-- scaled by the round's length against the matched rounds' mean (k1 = 1.2,
-- b = 0.4, milder than the customary 0.75: a round whose answer is long
-- still counts its question's words; a word counts once in a round). A
-- word in most of the owner's rounds (a name said in every greeting) weighs
-- little, a rare one much, so a round that says something rare outranks a
-- short one that only names who it is about. PL/pgSQL, whose statements
-- are planned through the plan cache on every PostgreSQL version (before
-- 18 a SQL function's statements are planned at every call, and without
-- their parameters' values), with
-- the call's values when a plan of its own is made: for a long history
-- (more than memchat.words_planned_from() rounds) a plan for this call's
-- words and caller, with the caller's partition pruned while planning (a
-- generic plan ANDs the words' GIN index with the owner index and reads
-- every one of the caller's entries from the latter), else the connection's
-- cached generic plan, made once. Bitmap scans on: the GIN index is read
-- through one. Not executable by users: it trusts p_user_id.
create function memchat.owned_rounds_matching(
  p_user_id uuid, p_agent_name text, p_model text, p_words tsquery, p_owned tsquery,
  p_session_id uuid, p_floor bigint, p_limit integer, p_rounds bigint
) returns bigint[]
language plpgsql stable
set search_path = ''
set enable_bitmapscan = on
-- Restored when the function returns; set below for the one statement.
set plan_cache_mode = force_generic_plan
as $$
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
$$;

-- The caller's rounds holding a word of p_words (memchat.owned_rounds_matching
-- for the verified claims' auth.uid(); none without claims), the plan chosen
-- by the history's length (p_rounds). SECURITY DEFINER, so that the GIN
-- index can be used: under row-level security the planner may not use it
-- for `@@` (ts_match_vq is not leakproof, so it cannot run before the
-- policy's filter), and every one of the caller's rows was read and tested.
-- Nested loops off: the sessions are hashed, where a generic plan expecting
-- the average user's one session would read the caller's keys once per
-- session.
create function memchat.rounds_matching(
  p_agent_name text, p_model text, p_words tsquery, p_session_id uuid, p_floor bigint,
  p_limit integer, p_rounds bigint
) returns bigint[]
language plpgsql stable security definer
set search_path = ''
set enable_nestloop = off
as $$
begin
  -- Without a user (claims without `sub`) both are null: no row matches.
  return memchat.owned_rounds_matching(
           auth.uid(), p_agent_name, p_model, p_words,
           pg_catalog.quote_literal(memchat.owner_lexeme(auth.uid()))::tsquery
             operator(pg_catalog.&&) p_words,
           p_session_id, p_floor, p_limit, p_rounds);
end
$$;
