-- The console's dead-letter list: see sql/mysql/0014.
CREATE INDEX idx_dead_letters_key ON dead_letters (record_key);
CREATE INDEX idx_dead_letters_group_class ON dead_letters (status, consumer_group, error_class);
