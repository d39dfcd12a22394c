-- The analytics pseudonyms' key padding (the secret's table, made after
-- this: tables/analytics_key.sql; the views: views.sql).
--
-- HMAC's padded key, `p_key` zero-filled to SHA-256's 64-byte block, each
-- byte xor `p_pad` (0x36 inner, 0x5c outer). Stored with the key (generated
-- columns), so a view computes a pseudonym with two sha256() calls and no
-- per-row key work.
create function memchat.analytics_key_pad(p_key bytea, p_pad integer) returns bytea
language plpgsql immutable strict parallel safe
set search_path = ''
as $$
begin
  return (
    select string_agg(
             set_byte('\x00'::bytea, 0,
                      (case when i < octet_length(p_key) then get_byte(p_key, i) else 0 end)
                      # p_pad),
             ''::bytea order by i)
      from generate_series(0, 63) as i);
end
$$;
