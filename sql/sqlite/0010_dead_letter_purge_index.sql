-- `orderpipe dlq purge`: see sql/mysql/0010.
CREATE INDEX idx_dead_letters_status_updated ON dead_letters (status, updated_ms);
