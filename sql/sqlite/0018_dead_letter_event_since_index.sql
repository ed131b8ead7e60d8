-- The dead-letter list filtered by event and time: see sql/mysql/0018.
CREATE INDEX idx_dead_letters_event_since ON dead_letters (event_name, last_failure_ms);
