-- How memchat.recall reads (measured, docs/benchmarks.md "Recall"): an
-- ordered scan of the owner index beats a bitmap scan of the same rows
-- (16.4 -> 12.9 ms median at 10,000 messages, 2.4 -> 2.2 at 1,000). The
-- planner picks the bitmap scan because, blind to how many rows one user has
-- behind RLS, it expects few. (A generic plan, planned once per connection,
-- saved another 0.5 ms for big users but chose worse plans on databases
-- with few users, so each call keeps its own plan.)
alter function memchat.recall(uuid, text, integer, extensions.vector, integer,
                              double precision, double precision)
  set enable_bitmapscan = off;
