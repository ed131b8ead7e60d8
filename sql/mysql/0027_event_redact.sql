-- An event definition's column rules (one table's {drop, hash, mask} column
-- lists, as JSON text): the columns cdc drops, hashes or masks in the rows of
-- the definition's table. NULL: none. Definitions of one table carry the same
-- rules or none; cdc --source reads them with the source's tables.
ALTER TABLE event_definitions ADD COLUMN redact_json TEXT NULL;
