-- The word list planned for its words (issue 22).
--
-- memchat.owned_rounds_matching (migration *_words_by_owner.sql) is one
-- SQL statement that the plan cache planned once for any query: a generic
-- plan, which cannot know how many of the caller's rounds hold the words.
-- For a long history it ANDed the words' GIN index with the owner index, so
-- every one of the caller's rounds was read from the owner index to pick out
-- the few thousand holding a word: 5 of 17 ms for a 50,000-round history
-- (docs/benchmarks.md, "The word list planned for its words"). Planned for
-- each call's words and caller, with the caller's partition pruned while
-- planning (0.5 ms), it reads the words' index alone. PostgreSQL before 18
-- plans a SQL function's statements at every call anyway.

alter function memchat.owned_rounds_matching(uuid, text, text, tsquery, tsquery, uuid, bigint,
                                             integer)
  set plan_cache_mode = force_custom_plan;
