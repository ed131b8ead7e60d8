-- See sql/mysql/0025_cdc_source_redact.sql.
ALTER TABLE cdc_sources ADD COLUMN redact_json TEXT NULL;
