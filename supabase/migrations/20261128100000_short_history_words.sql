-- A history of up to 300 rounds keeps every query word (issue 22).
--
-- memchat.rarer_words leaves a history's commonest query words out of the
-- word list until the rounds expected to hold one of the rest fit
-- memchat.words_budget() (100 since migration *_words_budget.sql, 300
-- before). Which words are common it reads from the statistics of the
-- caller's recall-key partition, so the words a history keeps depend on the
-- other users of that partition and on when it was last analysed; a
-- partition never analysed has no statistics, and then every word is kept.
--
-- *_words_budget.sql was measured on LongMemEval's dev split on partitions
-- that had never been analysed (autovacuum's threshold for them is 5,000
-- changed rows, migration *_partition_autovacuum.sql), where no budget
-- prunes anything: "the same scores for budgets of 50 to 300" measured
-- nothing. Replayed with every partition analysed, budget 100 gives session
-- recall_all@5 / recall_all@10 / NDCG@10 / exchange any@3 / any@5 / all@10
-- 0.937 / 0.979 / 0.975 / 0.905 / 0.958 / 0.884, against 0.947 / 0.979 /
-- 0.960 / 0.905 / 0.958 / 0.895 with every word. Now that the backfill
-- analyses young partitions (migration *_young_partition_statistics.sql),
-- the benchmark's histories (211-300 rounds each) met statistics in some
-- partitions and not in others, and two runs gave different scores.
--
-- The budget is there for cost: ranking a long history's rounds that hold a
-- common word. A history of up to 300 rounds is ranked whole for less than
-- the old budget allowed, so it keeps every word, whatever the partition's
-- statistics: its recall no longer depends on other users' words or on
-- when autovacuum ran. Longer histories prune to memchat.words_budget() as
-- before. (LongMemEval's histories all fall under 300 rounds: its figures
-- are those of the word list whole, as measured until now.)
--
-- memchat.rarer_words differs from migration *_common_words.sql only in its
-- first test.
create function memchat.words_whole_rounds() returns integer
language sql immutable parallel safe
set search_path = ''
as $$ select 300 $$;

revoke all on function memchat.words_whole_rounds() from public;

create or replace function memchat.rarer_words(p_words tsquery, p_rounds bigint, p_budget integer)
returns tsquery
language plpgsql stable security definer
set search_path = ''
as $$
declare
  v_lexemes text[];
  v_elems text[];
  v_freqs real[];
  v_floor real;
  v_kept text[] := '{}';
  v_expected double precision := 0;
  v_lexeme record;
begin
  if p_words is null or p_rounds <= greatest(p_budget, memchat.words_whole_rounds())
     or p_words::text ~ '[!<]' then
    return p_words;
  end if;
  select s.most_common_elems::text::text[], s.most_common_elem_freqs
    into v_elems, v_freqs
    from pg_catalog.pg_stats s
   where s.schemaname = 'memchat'
     and s.tablename = memchat.key_partition_name('message_embeddings', auth.uid())
     and s.attname = 'lexemes';
  if v_elems is null then
    return p_words;  -- not analysed yet: every word
  end if;
  -- most_common_elem_freqs ends with the least and greatest listed share
  -- and the share of nulls.
  v_floor := v_freqs[cardinality(v_elems) + 1];
  v_lexemes := array(select distinct l[1] from pg_catalog.regexp_matches(p_words::text, '''((?:[^'']|'''')+)''', 'g') l);
  for v_lexeme in
    select q.lexeme, coalesce(f.freq, v_floor) as freq
      from unnest(v_lexemes) q(lexeme)
      left join unnest(v_elems, v_freqs[1:cardinality(v_elems)]) f(elem, freq)
        on f.elem = replace(q.lexeme, '''''', '''')
     order by 2, 1
  loop
    exit when cardinality(v_kept) > 0 and v_expected + v_lexeme.freq * p_rounds > p_budget;
    v_kept := v_kept || v_lexeme.lexeme;
    v_expected := v_expected + v_lexeme.freq * p_rounds;
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
