-- The relay claims per shard: the oldest unsent rows of one shard, in id
-- order. This index serves that claim as a range read in order, and no
-- relay scans (or waits behind) another shard's rows. It replaces the
-- (sent_ms, id) index: every row's mark as sent moves an entry in each index.
CREATE INDEX idx_outbox_shard_unsent ON outbox_messages (shard, sent_ms, id);
DROP INDEX idx_outbox_unsent ON outbox_messages;
