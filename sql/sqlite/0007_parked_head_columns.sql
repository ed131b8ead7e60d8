-- Head-origin columns for the embedded default (SQLite); see sql/mysql/0007_parked_head_columns.sql.
ALTER TABLE parked_keys ADD COLUMN head_topic TEXT NOT NULL DEFAULT '';
ALTER TABLE parked_keys ADD COLUMN head_partition INTEGER NOT NULL DEFAULT 0;
ALTER TABLE parked_keys ADD COLUMN head_offset INTEGER NOT NULL DEFAULT 0;

-- head_origin is 'topic/partition/offset'; a topic has no '/'.
UPDATE parked_keys SET
    head_topic     = substr(head_origin, 1, instr(head_origin, '/') - 1),
    head_partition = CAST(substr(substr(head_origin, instr(head_origin, '/') + 1), 1,
                         instr(substr(head_origin, instr(head_origin, '/') + 1), '/') - 1) AS INTEGER),
    head_offset    = CAST(substr(substr(head_origin, instr(head_origin, '/') + 1),
                         instr(substr(head_origin, instr(head_origin, '/') + 1), '/') + 1) AS INTEGER);
