-- The relay claims per shard, oldest unsent first: see sql/mysql/0008.
CREATE INDEX idx_outbox_shard_unsent ON outbox_messages (shard, sent_ms, id);
DROP INDEX idx_outbox_unsent;
