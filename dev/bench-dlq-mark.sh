#!/usr/bin/env bash
# The cost of `dlq replay`'s mark (status 'pending' -> 'replayed') before and
# after migration 0028, and of the migration itself, on one table:
#   1. a database migrated up to 0027, filled with ROWS pending dead letters
#      (about a real dead letter's size: 600-byte payload, 900-byte headers),
#      in transactions of 100,000 rows, with progress;
#   2. the first 100,000 marked as `dlq replay` marks them, 1,000 ids per
#      UPDATE: µs per row in the schema before 0028;
#   3. `orderpipe migrate` (0028: the never-replayed rows set to 0, the table
#      rebuilt): timed, seconds per million rows;
#   4. the next 100,000 marked the same way: µs per row after 0028.
#
#   dev/bench-dlq-mark.sh [ROWS]   (default 1000000, at least 200000; needs `make dev-up`)
set -euo pipefail
ROWS="${1:-1000000}"
(( ROWS >= 200000 )) || { echo "ROWS must be at least 200000 (two rounds of 100,000 marks)" >&2; exit 2; }
source "$(dirname "${BASH_SOURCE[0]}")/bench-common.sh"
DB="${RUN_ID}_mark"
db_at_version "$DB" 27

echo "== 1. $ROWS pending dead letters in the schema of before 0028"
insert_rows() {
  SQL "$DB" -e "INSERT INTO dead_letters (consumer_group, original_topic, original_partition, original_offset,
      original_timestamp, record_key, payload, headers, event_id, event_name, error_class, error_message, attempts,
      first_failure_ms, last_failure_ms, dlq_partition, dlq_offset, created_ms, updated_ms)
    SELECT '$RUN_ID-group', 'order.events.v1', seq % 12, seq, 1, seq % 100000, REPEAT('p', 600),
      CONCAT('{\"event_id\":\"', UUID(), '\",\"h\":\"', REPEAT('h', 850), '\"}'), UUID(), 'order.created',
      'handler_fatal', 'fatal: the handler refused the event', 1, 1, 1, seq % 12, seq, 1, 1
    FROM seq_${1}_to_${2}"
}
in_chunks "$ROWS" insert_rows

# mark FIRST_ID: 100 UPDATEs of 1,000 ids each from FIRST_ID, as
# src/dlq/store.rs's mark_replayed writes them; prints µs per row.
mark() {
  python3 - "$1" > "$OUT_DIR/.marks.sql" <<'PY'
import sys
first = int(sys.argv[1])
for i in range(100):
    ids = ",".join(str(first + i * 1000 + j) for j in range(1000))
    print("UPDATE dead_letters SET status = 'replayed', replay_count = replay_count + 1, "
          f"last_replayed_ms = 1796000000000, updated_ms = 1796000000000 WHERE id IN ({ids});")
PY
  local t0 t1
  t0=$(date +%s.%N); SQL "$DB" < "$OUT_DIR/.marks.sql"; t1=$(date +%s.%N)
  python3 -c 'import sys; print(f"{(float(sys.argv[2]) - float(sys.argv[1])) * 1e6 / 100000:.1f}")' "$t0" "$t1"
}
FIRST=$(SQL -e "SELECT MIN(id) FROM $DB.dead_letters")
echo "== 2. 100,000 rows marked replayed, schema of before 0028"
BEFORE=$(mark "$FIRST")
echo "   $BEFORE µs per row"
echo "== 3. orderpipe migrate (0028)"
t0=$(date +%s.%N)
"$BIN" migrate >/dev/null 2>"$OUT_DIR/.migrate.log" || { cat "$OUT_DIR/.migrate.log" >&2; exit 1; }
t1=$(date +%s.%N)
MIG=$(python3 -c 'import sys; print(f"{float(sys.argv[2]) - float(sys.argv[1]):.1f}")' "$t0" "$t1")
PER_M=$(python3 -c 'import sys; print(f"{float(sys.argv[1]) * 1e6 / int(sys.argv[2]):.1f}")' "$MIG" "$ROWS")
echo "   $MIG s for $ROWS rows: $PER_M s per million"
echo "== 4. the next 100,000 rows marked replayed, after 0028"
# Ids are consecutive within one INSERT, not across two: the second
# chunk's first id is read, not computed.
AFTER=$(mark "$(SQL -e "SELECT id FROM $DB.dead_letters ORDER BY id LIMIT 1 OFFSET 100000")")
echo "   $AFTER µs per row"
[ "$(SQL -e "SELECT COUNT(*) FROM $DB.dead_letters WHERE status = 'replayed'")" -eq 200000 ] \
  || { echo "bench: expected 200000 rows marked replayed" >&2; exit 1; }

echo
echo "dlq replay's mark, 1,000 ids per UPDATE, on $ROWS dead letters: before 0028 $BEFORE µs per row, after $AFTER µs (after/before $(python3 -c "print(f'{$AFTER / $BEFORE:.2f}')"))"
echo "migration 0028: $PER_M s per million dead letters"
CMD="ORDERPIPE_DATABASE__URL=$DB_URL_BASE/$DB dev/bench-dlq-mark.sh $ROWS"
result dlq-mark "before 0028" "mark cost" "$BEFORE" µs/row "" "$CMD"
result dlq-mark "after 0028" "mark cost" "$AFTER" µs/row "before 0028" "$CMD"
result dlq-mark "migration 0028" "seconds per million rows" "$PER_M" s "" "$CMD"
rm -f "$OUT_DIR/.marks.sql" "$OUT_DIR/.migrate.log"
SQL -e "DROP DATABASE $DB"
