# Sourced (after dev/bench-common.sh) by dev/bench-cdc.sh and dev/cdc-vs-debezium.sh:
# Debezium's MariaDB connector in Kafka Connect standalone, the peer of `orderpipe cdc`.
# Its jars come from Maven Central (dev/debezium/pom.xml) into the stack's plugin folder; Kafka 4.4
# moved a class Debezium 3.5 calls, so a 3-method shim (dev/debezium/Sanitizer.java) goes on the
# worker's class path. Callers start with dbz_run.
KAFKA_LIB="$ROOT/.stack/lib/kafka"
PLUGINS="$ROOT/.stack/lib/connect-plugins"
SHIM="$ROOT/.stack/lib/connect-shim/sanitizer-shim.jar"
DBZ_VERSION="$(sed -n 's:.*<debezium.version>\(.*\)</debezium.version>.*:\1:p' "$ROOT/dev/debezium/pom.xml")"

# dbz_run PREFIX: a run of its own: RUN_ID (PREFIX, the second and the pid: bench-common's RUN_ID is
# the second alone, which another benchmark started then shares; the topics' prefix), the database
# name DB, the scratch folder WORK and PIDS, the processes it starts. On exit those processes, the
# database, the topics and the folder go (KEEP_WORK=1 keeps the folder for a look).
dbz_run() {
  RUN_ID="$1$(date +%s)p$$"
  DB="$RUN_ID"
  WORK="$OUT_DIR/.$RUN_ID"
  mkdir -p "$WORK"
  PIDS=()
  trap dbz_run_cleanup EXIT
}
dbz_run_cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  SQL -e "DROP DATABASE IF EXISTS $DB" 2>/dev/null || true
  # the heartbeat topic is outside $RUN_ID.*, which drop_topics deletes
  "$STACK" kafka-topics --delete --topic "__debezium-heartbeat.$RUN_ID.dbz" >/dev/null 2>&1 || true
  drop_topics
  if [ -n "${KEEP_WORK:-}" ]; then echo "kept $WORK"; else rm -rf "$WORK"; fi
}

# dbz_resolve: the connector's jars and the shim, each only if missing; 1 when they cannot be had.
dbz_resolve() {
  if [ ! -f "$PLUGINS/debezium-mariadb/.complete" ]; then
    echo "== Debezium: resolving the connector's jars from Maven Central"
    mvn -B -q --no-transfer-progress -f "$ROOT/dev/debezium/pom.xml" dependency:copy-dependencies \
      -Ddebezium.lib.dir="$PLUGINS/debezium-mariadb" > "$WORK/mvn.log" 2>&1 \
      || { tail -20 "$WORK/mvn.log" >&2; return 1; }
    touch "$PLUGINS/debezium-mariadb/.complete"
  fi
  if [ ! -f "$SHIM" ]; then
    mkdir -p "$(dirname "$SHIM")/classes"
    javac -d "$(dirname "$SHIM")/classes" -cp "$KAFKA_LIB/*" "$ROOT/dev/debezium/Sanitizer.java" \
      && jar cf "$SHIM" -C "$(dirname "$SHIM")/classes" . || return 1
  fi
}

# dbz_config SCHEMAS DB TABLES: $WORK/worker.properties (JSON converter, schemas.enable=SCHEMAS),
# $WORK/connector.properties (database DB, table.include.list TABLES, streaming only: snapshot.mode
# no_data; topics $RUN_ID.dbz.DB.TABLE) and $WORK/log4j2.properties. Callers append their own
# settings to either file (a later key wins in a properties file).
dbz_config() {
  cat > "$WORK/worker.properties" <<PROPS
bootstrap.servers=$BOOTSTRAP
key.converter=org.apache.kafka.connect.json.JsonConverter
value.converter=org.apache.kafka.connect.json.JsonConverter
key.converter.schemas.enable=$1
value.converter.schemas.enable=$1
offset.storage.file.filename=$WORK/dbz.offsets
offset.flush.interval.ms=1000
plugin.path=$PLUGINS
listeners=http://127.0.0.1:0
PROPS
  cat > "$WORK/connector.properties" <<PROPS
name=$RUN_ID-dbz
connector.class=io.debezium.connector.mariadb.MariaDbConnector
database.hostname=127.0.0.1
database.port=3306
database.user=orderpipe
database.password=orderpipe
database.server.id=$((30000 + RANDOM))
topic.prefix=$RUN_ID.dbz
database.include.list=$2
table.include.list=$3
snapshot.mode=no_data
include.schema.changes=false
heartbeat.interval.ms=1000
schema.history.internal.kafka.bootstrap.servers=$BOOTSTRAP
schema.history.internal.kafka.topic=$RUN_ID.dbz.history
schema.history.internal.store.only.captured.databases.ddl=true
schema.history.internal.store.only.captured.tables.ddl=true
topic.creation.default.replication.factor=1
topic.creation.default.partitions=3
PROPS
  printf '%s\n' 'status = error' 'appender.out.type = Console' 'appender.out.name = out' \
    'appender.out.layout.type = PatternLayout' 'appender.out.layout.pattern = [%d] %p %m (%c)%n' \
    'rootLogger.level = WARN' 'rootLogger.appenderRef.out.ref = out' \
    'logger.dbz.name = io.debezium' 'logger.dbz.level = INFO' > "$WORK/log4j2.properties"
}

# dbz_start: Connect standalone with $WORK's properties in the background (PEER_PID, log
# $WORK/connect.log), returning once the connector streams the binlog; 1 (the log's tail
# printed) when it does not.
dbz_start() {
  : > "$WORK/connect.log"
  java -Xms256m -Xmx1g -Dlog4j2.configurationFile="$WORK/log4j2.properties" -cp "$KAFKA_LIB/*:$SHIM" \
    org.apache.kafka.connect.cli.ConnectStandalone "$WORK/worker.properties" "$WORK/connector.properties" \
    >> "$WORK/connect.log" 2>&1 &
  PEER_PID=$!; PIDS+=("$PEER_PID")
  for _ in $(seq 600); do
    grep -q "Keepalive thread is running" "$WORK/connect.log" && return
    grep -q "ERROR Producer failure" "$WORK/connect.log" && break
    sleep 0.1
  done
  tail -30 "$WORK/connect.log" >&2; echo "Debezium did not start streaming" >&2; return 1
}
