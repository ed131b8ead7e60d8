-- One index for the gauges and the console's group + class filter: see sql/mysql/0029.
DROP INDEX idx_dead_letters_gauge;
DROP INDEX idx_dead_letters_group_class;
CREATE INDEX idx_dead_letters_group_class_event ON dead_letters (status, consumer_group, error_class, event_name);
