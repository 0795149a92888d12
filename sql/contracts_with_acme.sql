-- What contracts do we have with Acme?
-- A filter on the parent type: has_label(labels, 'Contract') matches MSA,
-- OrderForm and PurchaseOrder nodes too, because a node carries the label
-- of every type in its chain. One row per contract: several facts may say
-- Acme is a party to it (an order record and a report listing the order);
-- it holds from the earliest and is over only when every one has ended.
SELECT c.name,
       c.type,
       c.labels,
       MIN(e.valid_at) AS valid_at,
       CASE WHEN bool_or(e.invalid_at IS NULL) THEN NULL
            ELSE MAX(e.invalid_at) END AS invalid_at
FROM nodes c
JOIN edges e    ON e.target_node_id = c.node_id
JOIN nodes acme ON acme.node_id = e.source_node_id
WHERE has_label(c.labels, 'Contract')
  AND acme.name_normalized = 'acme corp'
  AND edge_type_matches(e.relation_type, 'PARTY_TO')
GROUP BY c.name, c.type, c.labels
ORDER BY c.type, c.name;
