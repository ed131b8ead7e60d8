-- An event definition's column rules (see the MariaDB migration).
ALTER TABLE event_definitions ADD COLUMN redact_json TEXT NULL;
