# Sourced by dev/bench-*.sh: paths, the release binary, a fresh run id and
# topic names of their own, so a benchmark never touches other data.
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STACK="$ROOT/dev/stack.sh"
BIN="${ORDERPIPE_BIN:-$ROOT/target/release/orderpipe}"
RUN_ID="bench$(date +%s)"
OUT_DIR="$ROOT/bench-results"
BOOTSTRAP="${ORDERPIPE_KAFKA__BOOTSTRAP_SERVERS:-127.0.0.1:9092}"
DB_URL_BASE="mysql://orderpipe:orderpipe@127.0.0.1:3306"
mkdir -p "$OUT_DIR"
[ -x "$BIN" ] || { echo "build first: cargo build --release --features harness" >&2; exit 1; }
# The bench-* commands and `produce --count` are the harness (make image
# builds the same path without it).
"$BIN" bench-naive-consume --help >/dev/null 2>&1 \
  || { echo "$BIN was built without the harness: cargo build --release --features harness" >&2; exit 1; }
export ORDERPIPE_TOPICS__ORDER_EVENTS__NAME="$RUN_ID.order.events.v1"
export ORDERPIPE_TOPICS__INVENTORY_EVENTS__NAME="$RUN_ID.inventory.events.v1"
export ORDERPIPE_TOPICS__DEAD_LETTER__NAME="$RUN_ID.order.events.v1.dlq"
TOPIC="$ORDERPIPE_TOPICS__ORDER_EVENTS__NAME"
SQL() { mariadb -h127.0.0.1 -uorderpipe -porderpipe -N -B "$@"; }
# A fresh database with the migrations applied.
mkdb() { SQL -e "CREATE DATABASE $1"; ORDERPIPE_DATABASE__URL="$DB_URL_BASE/$1" "$BIN" migrate >/dev/null; }
