-- Dead outbox rows for the embedded default (SQLite); see
-- sql/mysql/0019_outbox_dead_rows.sql.
ALTER TABLE outbox_messages ADD COLUMN dead_ms INTEGER;
ALTER TABLE outbox_messages ADD COLUMN dead_reason TEXT;
CREATE INDEX idx_outbox_dead ON outbox_messages (shard, dead_ms, message_key);
