-- A cdc source's column rules (cdc.redact's shape, as JSON text): per
-- table, the columns cdc drops, hashes or masks before they leave the
-- process. NULL: none. cdc reads them with the source's tables.
ALTER TABLE cdc_sources ADD COLUMN redact_json TEXT NULL;
