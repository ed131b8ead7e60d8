-- The log-based relay (outbox.source = "binlog") reads one binlog per
-- source; this lease says which relay instance reads it, until when. A
-- standby waits for it to expire. Fencing by transactional.id still guards
-- the Kafka side against a zombie that believes it holds the lease.
CREATE TABLE relay_source_leases (
    source     VARCHAR(255) NOT NULL PRIMARY KEY,
    owner      VARCHAR(255) NOT NULL,
    expires_ms BIGINT       NOT NULL
) ENGINE=InnoDB;
