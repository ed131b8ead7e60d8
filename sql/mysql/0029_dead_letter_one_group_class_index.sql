-- `status` leads four of dead_letters' secondary indexes, and a change of
-- status (`dlq replay`'s mark, `dlq ignore`) moves the row's entry in each:
-- 10-17 us of MariaDB CPU per marked row per index (docs/tuning.md
-- "Replay: one index fewer to move"). Two of them differed only in their
-- tail: the gauges' (status, group, event, class) and the console's
-- (status, group, class). One index in the order (status, group, class,
-- event) serves both: the gauges' GROUP BY reads it alone, and the
-- console's group + class filter is a range of it (a page then sorts that
-- range's ids instead of reading them in order).
ALTER TABLE dead_letters
    DROP INDEX idx_dead_letters_gauge,
    DROP INDEX idx_dead_letters_group_class,
    ADD INDEX idx_dead_letters_group_class_event (status, consumer_group, error_class, event_name);
