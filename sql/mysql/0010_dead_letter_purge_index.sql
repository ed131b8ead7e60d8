-- `orderpipe dlq purge` deletes dead letters of a status whose row last
-- changed (failed, replayed or ignored: updated_ms) before a cutoff, a small
-- batch per statement: this index makes each batch a range read of the rows
-- it deletes, however many younger rows of that status there are.
CREATE INDEX idx_dead_letters_status_updated ON dead_letters (status, updated_ms);
