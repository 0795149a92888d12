-- What contracts do we have with Acme?
-- A filter on the parent type: has_label(labels, 'Contract') matches MSA,
-- OrderForm and PurchaseOrder nodes too, because a node carries the label
-- of every type in its chain.
SELECT c.name,
       c.type,
       c.labels,
       e.valid_at,
       e.invalid_at
FROM nodes c
JOIN edges e    ON e.target_node_id = c.node_id
JOIN nodes acme ON acme.node_id = e.source_node_id
WHERE has_label(c.labels, 'Contract')
  AND acme.name_normalized = 'acme corp'
  AND edge_type_matches(e.relation_type, 'PARTY_TO')
ORDER BY c.type, c.name;
