-- No word list where even the query's rarest word is common.
--
-- memchat.rarer_words keeps a long history's rarer query words, those whose
-- expected rounds fit memchat.words_budget(), and always kept the rarest,
-- however many rounds hold it. In a history of 50,000 rounds a query whose
-- rarest word is in 6,567 of them had all of those rounds read and ranked
-- (25 ms of a 48 ms recall) to give a list of 20 that one common word cannot
-- tell apart. Now, when the rarest word alone is expected in more than ten
-- times the budget's rounds, there is no word list: recall ranks by meaning
-- (docs/benchmarks.md, "No word list when every word is common"). Histories
-- of fewer than 3,000 rounds (ten times the budget) are never affected.

-- As in migration *_key_partitions.sql, returning null past ten budgets.
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
  if p_words is null or p_rounds <= p_budget or p_words::text ~ '[!<]' then
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
