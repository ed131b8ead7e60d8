-- The console's dead-letter list filtered by class alone: see sql/mysql/0016.
CREATE INDEX idx_dead_letters_class ON dead_letters (error_class);
