-- Which purchase orders are open with Acme?
-- A filter on the specific type: only PurchaseOrder nodes, not every
-- contract. "Open" is the order's status attribute; the PARTY_TO fact that
-- links Acme to the order must still hold (not invalidated, not expired).
-- DISTINCT: several such facts may hold (the order's record and a report
-- that lists it).
SELECT DISTINCT po.name                                   AS purchase_order,
       json_get_str(po.attributes, 'po_number')  AS po_number,
       CAST(json_get_str(po.attributes, 'amount') AS DOUBLE) AS amount,
       json_get_str(po.attributes, 'issued_on')  AS issued_on
FROM nodes po
JOIN edges e    ON e.target_node_id = po.node_id
JOIN nodes acme ON acme.node_id = e.source_node_id
WHERE has_label(po.labels, 'PurchaseOrder')
  AND acme.name_normalized = 'acme corp'
  AND edge_type_matches(e.relation_type, 'PARTY_TO')
  AND e.invalid_at IS NULL
  AND e.expired_at IS NULL
  AND json_get_str(po.attributes, 'status') = 'open'
ORDER BY po.name;
