-- Outbox rows that can never be published as they are (a record over the
-- producer's message.max.bytes or the topic's max.message.bytes): the relay
-- dead-letters them instead of retrying their Kafka transaction forever.
-- A dead row gets sent_ms (it leaves the unsent range of the claim's index)
-- and dead_ms with the reason; it keeps its envelope (the purge of sent rows
-- skips dead rows) so that an operator can re-queue it after raising the
-- limit (SET sent_ms = NULL, dead_ms = NULL) or give it up (SET dead_ms =
-- NULL). While a row of an order is dead, the later rows of that order wait
-- unsent behind it (per-key order); idx_outbox_dead finds the dead keys of a
-- shard from the dead rows alone.
ALTER TABLE outbox_messages ADD COLUMN dead_ms BIGINT NULL, ADD COLUMN dead_reason TEXT NULL;
CREATE INDEX idx_outbox_dead ON outbox_messages (shard, dead_ms, message_key);
