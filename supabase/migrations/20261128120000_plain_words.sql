-- Recall's word list matches any word of the message, read as plain words.
--
-- memchat.any_words read the message as a web search (websearch_to_tsquery)
-- and turned its ANDs into ORs. What a chat message writes is not search
-- syntax, and two of its readings broke the list:
--
-- * A hyphenated word ("bike-related", "follow-up", "e-mail") became a
--   phrase of the compound and its parts ('bike-rel' <-> 'bike' <->
--   'relat'), found only where the same compound is written: "my
--   bike-related expenses" did not reach "I bought bike lights".
-- * A minus before a word ("pizza -pineapple", "it was -5 degrees", "so-so
--   -tired") became a negation, and ORed with the rest, !'pineappl' matched
--   every round that does not hold the word: nearly all of them.
--
-- Both also kept memchat.rarer_words from leaving the commonest words out
-- (it left phrases and negations whole), so the budget that holds a long
-- history's word list to about 100 rounds did not apply. Measured on a
-- bench_recall.py database (a user of 10,000 and one of 100,000 messages;
-- the query's last word after a minus, or its first two words joined by a
-- hyphen): recall median 7.6-9.0 / 17.0-18.3 ms with plain words,
-- 31.9-35.9 / 197-208 ms with the minus, 20.2-20.9 / 139-142 ms with the
-- hyphen (docs/benchmarks.md).
--
-- Now the words are the message's lexemes as Postgres indexes text
-- (to_tsvector, English): a hyphenated word gives the compound and each
-- part, quotes and minus signs are punctuation, "or" is a stop word. Each
-- lexeme is quoted for tsquery's input, its quotes and backslashes doubled.
-- The result is only ever lexemes joined by |.
create or replace function memchat.any_words(p_text text) returns tsquery
language sql immutable parallel safe
set search_path = ''
as $$
  select nullif(array_to_string(array(
           select '''' || replace(replace(l.lexeme, '\', '\\'), '''', '''''') || ''''
             from unnest(tsvector_to_array(to_tsvector('english'::regconfig, coalesce(p_text, ''))))
                  as l(lexeme)), ' | '), '')::tsquery
$$;

-- memchat.rarer_words no longer leaves a query holding ! or < whole: its
-- words are lexemes joined by | (above), and a lexeme may hold either
-- character itself (a URL's path: 'a.com/x!y'), which kept such a message's
-- words from the budget. Otherwise as in migration *_short_history_words.sql.
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
  if p_words is null or p_rounds <= greatest(p_budget, memchat.words_whole_rounds()) then
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
