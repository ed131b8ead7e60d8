-- The dead-letter gauges (src/dlq/gauges.rs) count pending rows by group,
-- event name and class every 15 s, in the persister and in every consumer
-- member: this index covers that GROUP BY, so it reads the index alone
-- (300k pending rows: 0.25 s -> 0.07 s for every group, 0.11 s -> 0.02 s
-- for one group of 54k).
CREATE INDEX idx_dead_letters_gauge ON dead_letters (status, consumer_group, event_name, error_class);
