-- Who works for whom, in any capacity?
-- edge_type_matches expands EMPLOYED_BY through edge_type_closure, so facts
-- typed WORKS_FULL_TIME_FOR or CONTRACTS_FOR (its subtypes) match as well.
SELECT p.name AS person,
       e.relation_type,
       c.name AS company,
       e.valid_at,
       e.invalid_at
FROM edges e
JOIN nodes p ON p.node_id = e.source_node_id
JOIN nodes c ON c.node_id = e.target_node_id
WHERE edge_type_matches(e.relation_type, 'EMPLOYED_BY')
ORDER BY person, e.valid_at NULLS FIRST, company;
