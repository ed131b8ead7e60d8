-- The dead-letter gauges' GROUP BY: see sql/mysql/0011.
CREATE INDEX idx_dead_letters_gauge ON dead_letters (status, consumer_group, event_name, error_class);
