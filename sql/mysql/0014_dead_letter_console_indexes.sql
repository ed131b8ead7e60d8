-- The console's dead-letter list (src/console/dead_letters.rs) filters by
-- order id (the record key) and by group + class, newest first, a page at a
-- time (keyset on the id). These indexes make each page an index range read:
-- by key, a prefix of the key (order ids are short; a longer key still
-- matches, it is only compared in the row); by status + group + class, rows
-- come in id order (InnoDB appends the primary key), so no sort of every
-- matching row is needed for a page of 50.
CREATE INDEX idx_dead_letters_key ON dead_letters (record_key(64));
CREATE INDEX idx_dead_letters_group_class ON dead_letters (status, consumer_group, error_class);
