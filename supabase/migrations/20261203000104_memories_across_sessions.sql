-- Written by `memchat db diff`: what supabase/schemas has that the
-- migrations before this one did not make:
--   function memchat.search_memories(text,extensions.vector,text,text,integer,double precision,boolean)

set local check_function_bodies = off;

CREATE OR REPLACE FUNCTION memchat.search_memories(p_agent_name text, p_query extensions.vector, p_model text, p_text text, p_limit integer, p_min_score double precision, p_durable boolean)
 RETURNS TABLE(id bigint, score double precision)
 LANGUAGE plpgsql
 STABLE
 SET search_path TO ''
AS $function$
declare
  v_words tsquery;
  v_lexemes text[];
  v_ids bigint[];
  v_current boolean;
begin
  if p_durable then
    select array_agg(m.id) into v_ids from memchat.memories m
     where m.user_id = (select auth.uid()) and m.agent_name = p_agent_name
       and m.expires_at is not null;
  else
    select array_agg(m.id) into v_ids from memchat.memories m
     where m.user_id = (select auth.uid()) and m.agent_name = p_agent_name;
  end if;
  if v_ids is null then
    return;  -- none: the words are not even looked at
  end if;
  v_words := memchat.any_words(p_text);
  v_lexemes := pg_catalog.tsvector_to_array(pg_catalog.to_tsvector('english'::regconfig, coalesce(p_text, '')));
  v_current := p_text ~* '\m(now|current|currently|latest|still|these days|most recent|recently|anymore|at the moment|presently|so far)\M';
  return query
  with own as materialized (
    select m.id, m.model, m.embedding, m.lexemes, m.created_at, m.session_id
      from memchat.memories m
     where m.user_id = (select auth.uid()) and m.id = any(v_ids)
  ), meaning as (
    select o.id, row_number() over (order by o.embedding operator(extensions.<=>) p_query, o.id desc)
             as r
      from own o
     where p_query is not null and o.model = p_model
     order by r
     limit p_limit * 2
  ), matching as materialized (
    select o.id, l.lexeme
      from own o
     cross join lateral unnest(pg_catalog.tsvector_to_array(o.lexemes)) l(lexeme)
     where v_words is not null and o.lexemes operator(pg_catalog.@@) v_words
       and l.lexeme = any(v_lexemes)
  ), rarity as (
    select m.lexeme,
           ln(1 + (cardinality(v_ids) - count(*) + 0.5) / (count(*) + 0.5)) as weight
      from matching m
     group by m.lexeme
  ), words as (
    select m.id, row_number() over (order by sum(w.weight) desc, m.id desc) as r
      from matching m
      join rarity w on w.lexeme = m.lexeme
     group by m.id
     order by r
     limit p_limit * 2
  ), fused as (
    select coalesce(a.id, b.id) as id,
           coalesce(1.0 / (20 + a.r), 0) + coalesce(1.0 / (20 + b.r), 0) as fused
      from meaning a
      full join words b on b.id = a.id
  ), kept as (
    select f.id, f.fused, x.similarity, o.embedding, o.created_at, o.session_id
      from fused f
      join own o on o.id = f.id
     cross join lateral (
       select case when p_query is not null and o.model = p_model
                   then 1 - (o.embedding operator(extensions.<=>) p_query) end as similarity) x
     where p_query is null or x.similarity >= p_min_score
  ), found as materialized (
    select k.id, k.fused * 0.9 ^ (row_number() over (partition by k.session_id
                                                    order by k.fused desc, k.id desc) - 1)
             as fused,
           k.similarity, k.embedding, k.created_at, k.session_id
      from kept k
     order by 2 desc, k.id desc
     limit p_limit
  )
  select a.id, a.similarity
    from found a
   cross join lateral (
     select max(b.fused) as fused
       from found b
      where b.id = a.id
         or (v_current and a.similarity is not null and b.similarity is not null
             and b.session_id <> a.session_id
             and 1 - (a.embedding operator(extensions.<=>) b.embedding)
                 >= greatest(a.similarity, b.similarity) - 0.1)) pair
   order by pair.fused desc, a.created_at desc, a.id desc;
end
$function$;
