-- Where a parked key's head was first consumed, as columns: operators' views
-- join a head to its dead letter (dead_letters.original_*) on them, and the
-- consumer compares them, instead of parsing head_origin ('topic/partition/
-- offset', still written for readers of the text form). Kafka topic names
-- cannot contain '/', so the backfill splits head_origin at its slashes.
ALTER TABLE parked_keys
    ADD COLUMN head_topic     VARCHAR(255) NOT NULL DEFAULT '',
    ADD COLUMN head_partition INT          NOT NULL DEFAULT 0,
    ADD COLUMN head_offset    BIGINT       NOT NULL DEFAULT 0;

UPDATE parked_keys SET
    head_topic     = SUBSTRING_INDEX(head_origin, '/', 1),
    head_partition = CAST(SUBSTRING_INDEX(SUBSTRING_INDEX(head_origin, '/', -2), '/', 1) AS SIGNED),
    head_offset    = CAST(SUBSTRING_INDEX(head_origin, '/', -1) AS SIGNED);
