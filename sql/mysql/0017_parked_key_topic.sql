-- A parked key is a key within a topic: a group reading several topics (a
-- router binding over the order topic and cdc.<db>.<table> topics) parked
-- order 7 and row 7 of a table as one key, so a failing order held an
-- unrelated row behind its dead letter. key_topic is the main topic the key
-- belongs to (a record read from the group's retry topic belongs to the
-- topic it was first consumed from, its orderpipe.original-topic header).
--
-- Rows parked before this migration get the topic of their head
-- (head_topic, where the head was first consumed), not the group's order
-- topic: the group's topics live in its configuration, not here, and the
-- head's retries and its dead letter's replay come back carrying that
-- topic, so they find their parked row again. A record held behind such a
-- key stays behind it, whatever topic it came from (it may be row 7 held
-- behind order 7): it is released with the head, in its order, as it
-- would have been; only records arriving from now on are told apart.
ALTER TABLE parked_keys ADD COLUMN key_topic VARCHAR(255) NOT NULL DEFAULT '' AFTER consumer_group;
UPDATE parked_keys SET key_topic = head_topic;
ALTER TABLE parked_keys
    DROP PRIMARY KEY,
    ADD PRIMARY KEY (consumer_group, key_topic, record_key),
    DROP KEY idx_parked_keys_partition,
    ADD KEY idx_parked_keys_partition (consumer_group, key_topic, kafka_partition);

ALTER TABLE held_records ADD COLUMN key_topic VARCHAR(255) NOT NULL DEFAULT '' AFTER consumer_group;
UPDATE held_records h
    JOIN parked_keys p ON p.consumer_group = h.consumer_group AND p.record_key = h.record_key
    SET h.key_topic = p.key_topic;
-- A held record without a parked row (none is expected: a key is unparked
-- only once nothing is held behind it) keeps the topic it was read from.
UPDATE held_records SET key_topic = source_topic WHERE key_topic = '';
ALTER TABLE held_records
    DROP KEY idx_held_records_key,
    ADD KEY idx_held_records_key (consumer_group, key_topic, record_key, id);
