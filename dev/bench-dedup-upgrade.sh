#!/usr/bin/env bash
# The upgrade to compact dedup rows (migration 0021 and `orderpipe dedup
# upgrade`) on an install holding ROWS dedup rows of the earlier schema:
#   1. a database migrated up to 0020, filled with ROWS rows as an earlier
#      release's claim wrote them (4 groups, v1 UUID text ids, 64-digit
#      digests), in transactions of 100,000 rows, with progress;
#   2. `orderpipe migrate` (0021: the groups copied, the table renamed, the
#      compact one created): timed;
#   3. `orderpipe dedup upgrade` moving every row, in its default batches,
#      timed, with its progress on stderr;
#   4. the rows checked: as many in event_dedup as were written, none left.
# Reports seconds per million rows for 2 and 3, and both tables' sizes.
#
#   dev/bench-dedup-upgrade.sh [ROWS]   (default 10000000; needs `make dev-up`)
set -euo pipefail
ROWS="${1:-10000000}"
source "$(dirname "${BASH_SOURCE[0]}")/bench-common.sh"
DB="${RUN_ID}_upgrade"
db_at_version "$DB" 20

echo "== 1. $ROWS dedup rows in the schema of before 0021"
insert_rows() {
  SQL "$DB" -e "INSERT INTO event_dedup (consumer_group, event_id, topic, kafka_partition, kafka_offset, event_type,
      record_key, payload_digest)
    SELECT CONCAT('$RUN_ID-group-', seq % 4), UUID(), 'order.events.v1', seq % 12, seq, 'order.created',
      seq % 100000, SHA2(seq, 256) FROM seq_${1}_to_${2}"
}
in_chunks "$ROWS" insert_rows
size() { SQL -e "SELECT ROUND((data_length + index_length) / 1048576) FROM information_schema.tables
  WHERE table_schema = '$DB' AND table_name = '$1'"; }
OLD_MB=$(size event_dedup)
echo "   old table: $OLD_MB MB (data + indexes)"

echo "== 2. orderpipe migrate (0021)"
t0=$(date +%s.%N); "$BIN" migrate >/dev/null; t1=$(date +%s.%N)
MIGRATE_S=$(python3 -c "print(round($t1 - $t0, 2))")
echo "   $MIGRATE_S s"

echo "== 3. orderpipe dedup upgrade"
t0=$(date +%s.%N); "$BIN" dedup upgrade --output json > "$OUT_DIR/.upgrade.json"; t1=$(date +%s.%N)
UPGRADE_S=$(python3 -c "print(round($t1 - $t0, 2))")
MOVED=$(jget "$OUT_DIR/.upgrade.json" 'r["moved"]')
LEFT=$(jget "$OUT_DIR/.upgrade.json" 'r["left"]')
STORED=$(SQL -e "SELECT COUNT(*) FROM $DB.event_dedup")
[ "$MOVED" = "$ROWS" ] && [ "$STORED" = "$ROWS" ] && [ "$LEFT" = 0 ] \
  || { echo "moved $MOVED, stored $STORED, left $LEFT of $ROWS" >&2; exit 1; }
SQL -e "ANALYZE TABLE $DB.event_dedup" >/dev/null
NEW_MB=$(size event_dedup)
PER_M() { python3 -c "print(round($1 * 1e6 / $ROWS, 1))"; }
echo
printf '| %s | %s |\n|---|---:|\n' "step ($ROWS rows)" "seconds per million rows"
printf '| migrate (0021) | %s |\n| dedup upgrade (move) | %s |\n' "$(PER_M "$MIGRATE_S")" "$(PER_M "$UPGRADE_S")"
echo "table size: $OLD_MB MB before, $NEW_MB MB after (data + indexes)"
result dedup-upgrade "$ROWS" migrate_s_per_million "$(PER_M "$MIGRATE_S")" s - "dev/bench-dedup-upgrade.sh $ROWS"
result dedup-upgrade "$ROWS" upgrade_s_per_million "$(PER_M "$UPGRADE_S")" s - "dev/bench-dedup-upgrade.sh $ROWS"
result dedup-upgrade "$ROWS" table_mb_before "$OLD_MB" MB - "dev/bench-dedup-upgrade.sh $ROWS"
result dedup-upgrade "$ROWS" table_mb_after "$NEW_MB" MB - "dev/bench-dedup-upgrade.sh $ROWS"
SQL -e "DROP DATABASE $DB"
