-- memchat.stored_messages reads one user's sessions: by the index led by
-- user_id, whatever the table's statistics say (a small table's could
-- choose a sequential scan, which would also read other users' rows and
-- make the work depend on them), and with one plan for every call.
alter function memchat.stored_messages()
  set enable_seqscan = off
  set plan_cache_mode = force_generic_plan;
