-- Dead letters keep what a failed record carried, whole. Every session is
-- strict (src/db.rs), so a value too long for its column is an error, and
-- the DLQ persister would retry such a batch forever: a key over 1,024
-- bytes or headers over 64 KB (Kafka's default record limit is 1 MB) now
-- fit. MEDIUMBLOB / MEDIUMTEXT hold 16 MB. The ALTER copies the table: it
-- is quick while the tables are small, as they are when the DLQ is drained.
ALTER TABLE dead_letters MODIFY record_key MEDIUMBLOB NULL, MODIFY headers MEDIUMTEXT NOT NULL;
ALTER TABLE held_records MODIFY headers MEDIUMTEXT NOT NULL;
