-- The word list ranks at most about 100 rounds instead of 300 (issue 22).
--
-- memchat.rarer_words keeps a history's rarer query words until the rounds
-- expected to hold one of them would pass memchat.words_budget(), and keeps
-- no word list when the rarest word alone is expected in more than ten
-- budgets' rounds (migration *_common_words.sql). The list recall fuses is
-- 20 deep; ranking 300 rounds to choose those 20 was most of the word
-- list's time, and of recall's: in tests/bench/bench_langgraph.py's data (a
-- query's words in 90% of a 1,000-round history) the word list took 1.05 ms
-- of a 3.2 ms recall, 0.37 ms within 100.
--
-- On LongMemEval's dev split (users of about 490 rounds) budgets of 50, 100,
-- 150, 200 and 300 give the same scores to the third digit: the words a
-- budget leaves out are the question's commonest, whose matches the rarer
-- words' already rank above. Histories of 100 rounds or fewer keep every
-- word, as before those of 300; no word list past 1,000 rounds expected
-- for the rarest word instead of 3,000 (docs/benchmarks.md, "The word list
-- within 100 rounds").
create or replace function memchat.words_budget() returns integer
language sql immutable parallel safe
set search_path = ''
as $$ select 100 $$;
