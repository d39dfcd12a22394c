-- Local development seed (`supabase start` / `supabase db reset`).
-- memchat needs no seed data: users come from Supabase Auth (or from
-- `memchat token` on the embedded database), and sessions from chatting.
select 1;
