-- Which facts held on 1 June 2025?
-- A fact holds at time t when it started at or before t (or its start is
-- unknown), had not ended by t, and has not been expired by a later fact.
-- Change the timestamp in `params` to ask about another moment.
WITH params AS (SELECT TIMESTAMP '2025-06-01T00:00:00Z' AS t)
SELECT s.name AS source,
       e.relation_type,
       o.name AS target,
       e.valid_at,
       e.invalid_at
FROM edges e
CROSS JOIN params
JOIN nodes s ON s.node_id = e.source_node_id
JOIN nodes o ON o.node_id = e.target_node_id
WHERE (e.valid_at IS NULL OR e.valid_at <= params.t)
  AND (e.invalid_at IS NULL OR e.invalid_at > params.t)
  AND e.expired_at IS NULL
ORDER BY e.relation_type, source, target;
