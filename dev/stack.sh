#!/usr/bin/env bash
# orderpipe local dev stack: Kafka 4 (KRaft, single node), Apicurio Registry 3 (Confluent-compatible
# API) and MariaDB, run as plain local processes on 127.0.0.1 (no Docker, no systemd). All state
# lives under .stack/ (git-ignored) in this repo, or under $ORDERPIPE_STACK_DIR.
#
#   dev/stack.sh deps                 install what is missing (apt packages, Kafka jars, Apicurio tarball)
#   dev/stack.sh build-deps           only the apt packages needed to build orderpipe
#   dev/stack.sh up                   start every service that does not answer yet; wait until all answer
#   dev/stack.sh down                 stop the services this script started (pid files), wait for exit
#   dev/stack.sh status               endpoints and up/down; exit 0 if all three answer, 1 otherwise
#   dev/stack.sh start|stop|restart SERVICE      SERVICE = kafka | registry | mariadb
#   dev/stack.sh kill SERVICE         SIGKILL it (a crash: no controlled shutdown), wait for exit
#   dev/stack.sh kafka-class CLASS [ARGS...]     run a Java main class on the Kafka class path
#   dev/stack.sh kafka-topics [ARGS...]          org.apache.kafka.tools.TopicCommand (adds --bootstrap-server)
#   dev/stack.sh sql [ARGS...]                   the mariadb client as the stack's user (e.g. sql -e 'SHOW DATABASES')
#   dev/stack.sh logs SERVICE [N]     tail the service's logs
#   dev/stack.sh clean                (stack down) delete Kafka/MariaDB/registry state, keep downloads
#
# Endpoints: kafka 127.0.0.1:9092 (controller 9093) | registry http://127.0.0.1:8081/apis/ccompat/v7
#            (global compatibility BACKWARD, in-memory storage: schemas are lost when it stops)
#            | mariadb mysql://orderpipe:orderpipe@127.0.0.1:3306/orderpipe (user has ALL ON *.*)
# Kafka runs on Java 17+ ($JAVA_HOME or java on PATH); Apicurio 3.3 needs Java 21+ (found automatically,
# e.g. /usr/lib/jvm/temurin-25-jdk-amd64, or set ORDERPIPE_REGISTRY_JAVA_HOME).
#
# Environment overrides (all optional):
#   ORDERPIPE_STACK_DIR (<repo>/.stack)   ORDERPIPE_STACK_TIMEOUT (120 s per service)
#   ORDERPIPE_KAFKA_PORT (9092)  ORDERPIPE_KAFKA_CONTROLLER_PORT (9093)  ORDERPIPE_KAFKA_HEAP (1G)
#   ORDERPIPE_KAFKA_TOOLS_OPTS (JVM options for kafka-class/kafka-topics; default -Xms64m -Xmx512m)
#   ORDERPIPE_REGISTRY_PORT (8081)  ORDERPIPE_REGISTRY_MGMT_PORT (9081)  ORDERPIPE_REGISTRY_HEAP (512m)
#   ORDERPIPE_REGISTRY_COMPATIBILITY (BACKWARD; NONE = no global rule)  ORDERPIPE_REGISTRY_JAVA_HOME
#   ORDERPIPE_APICURIO_VERSION (3.3.3)    ORDERPIPE_MARIADB_PORT (3306)
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$SCRIPT_DIR/.." && pwd)"
STACK_DIR="${ORDERPIPE_STACK_DIR:-$REPO_ROOT/.stack}"
mkdir -p "$STACK_DIR"
STACK_DIR="$(cd "$STACK_DIR" && pwd)"

HOST=127.0.0.1
TIMEOUT="${ORDERPIPE_STACK_TIMEOUT:-120}"

KAFKA_PORT="${ORDERPIPE_KAFKA_PORT:-9092}"
KAFKA_CONTROLLER_PORT="${ORDERPIPE_KAFKA_CONTROLLER_PORT:-9093}"
KAFKA_HEAP="${ORDERPIPE_KAFKA_HEAP:-1G}"
KAFKA_POM="$SCRIPT_DIR/kafka/pom.xml"
KAFKA_LIB="$STACK_DIR/lib/kafka"
KAFKA_DIR="$STACK_DIR/kafka"
KAFKA_DATA="$KAFKA_DIR/data"

APICURIO_VERSION="${ORDERPIPE_APICURIO_VERSION:-3.3.3}"
APICURIO_ARTIFACT="io.apicurio:apicurio-registry-app:${APICURIO_VERSION}:tar.gz:all"
APICURIO_HOME="$STACK_DIR/lib/apicurio-registry-$APICURIO_VERSION"
REGISTRY_DIR="$STACK_DIR/registry"
REGISTRY_PORT="${ORDERPIPE_REGISTRY_PORT:-8081}"
REGISTRY_MGMT_PORT="${ORDERPIPE_REGISTRY_MGMT_PORT:-9081}"
REGISTRY_HEAP="${ORDERPIPE_REGISTRY_HEAP:-512m}"
REGISTRY_COMPAT="${ORDERPIPE_REGISTRY_COMPATIBILITY:-BACKWARD}"
REGISTRY_URL="http://$HOST:$REGISTRY_PORT/apis/ccompat/v7"

MARIADB_DIR="$STACK_DIR/mariadb"
MARIADB_DATA="$MARIADB_DIR/data"
MARIADB_SOCK="$MARIADB_DIR/mysqld.sock"
MARIADB_PORT="${ORDERPIPE_MARIADB_PORT:-3306}"
DB_NAME=orderpipe
DB_USER=orderpipe
DB_PASS=orderpipe

# What building orderpipe needs (bundled librdkafka wants cmake and libcurl
# headers even with curl off), then what the services need.
BUILD_PACKAGES=(cmake make g++ libcurl4-openssl-dev libssl-dev libsasl2-dev zlib1g-dev libzstd-dev pkg-config)
# chromium + chromium-driver: the console's browser tests (tests/it/console*.rs, WebDriver).
APT_PACKAGES=("${BUILD_PACKAGES[@]}" mariadb-server mariadb-client curl prometheus chromium chromium-driver)
SERVICES=(mariadb kafka registry)

# ----------------------------------------------------------------------------- helpers
log() { printf '[stack] %s\n' "$*" >&2; }
die() { printf '[stack] ERROR: %s\n' "$*" >&2; exit 1; }

java_bin() {
  if [[ -n "${JAVA_HOME:-}" && -x "$JAVA_HOME/bin/java" ]]; then echo "$JAVA_HOME/bin/java"
  elif command -v java >/dev/null 2>&1; then command -v java
  else die "java not found (Java 17+ needed); run: dev/stack.sh deps"; fi
}

# Major version of the JDK/JRE whose bin/java is $1 (reads <home>/release; no JVM start).
java_major() {
  local home rel v
  home="$(dirname "$(dirname "$(readlink -f "$1")")")"
  rel="$home/release"
  if [[ -f "$rel" ]]; then v="$(sed -n 's/^JAVA_VERSION="\([0-9]*\).*/\1/p' "$rel")"
  else v="$("$1" -version 2>&1 | sed -n '1s/.*version "\([0-9]*\).*/\1/p')"; fi
  [[ "$v" =~ ^[0-9]+$ ]] && echo "$v" || echo 0
}

# Apicurio Registry 3.3.x is compiled for Java 21 (class file 65): pick a Java >= 21 for it.
# Order: $ORDERPIPE_REGISTRY_JAVA_HOME, $JAVA_HOME, java on PATH, newest JDK under /usr/lib/jvm.
REGISTRY_MIN_JAVA=21
registry_java_bin() {
  local c cands=()
  [[ -n "${ORDERPIPE_REGISTRY_JAVA_HOME:-}" ]] && cands+=("$ORDERPIPE_REGISTRY_JAVA_HOME/bin/java")
  [[ -n "${JAVA_HOME:-}" ]] && cands+=("$JAVA_HOME/bin/java")
  command -v java >/dev/null 2>&1 && cands+=("$(command -v java)")
  for c in "${cands[@]}"; do
    [[ -x "$c" ]] || continue
    if (( $(java_major "$c") >= REGISTRY_MIN_JAVA )); then echo "$c"; return 0; fi
  done
  local best="" best_v=0 v
  for c in /usr/lib/jvm/*/bin/java; do
    [[ -x "$c" ]] || continue
    v="$(java_major "$c")"
    if (( v > best_v )); then best="$c"; best_v="$v"; fi
  done
  (( best_v >= REGISTRY_MIN_JAVA )) && { echo "$best"; return 0; }
  return 1
}

MVN_FLAGS=(-B -q --no-transfer-progress -Dstyle.color=never)
mvn_bin() { command -v mvn >/dev/null 2>&1 || die "mvn not found; run: dev/stack.sh deps"; command -v mvn; }

# Maven 3.8 -q still prints colour codes; keep its output in a log, show it only on failure.
run_mvn() {
  local mlog="$STACK_DIR/maven.log"
  if ! "$(mvn_bin)" "${MVN_FLAGS[@]}" "$@" >"$mlog" 2>&1; then
    sed 's/\x1b\[[0-9;]*m//g' "$mlog" | tail -n 40 >&2
    return 1
  fi
}

# Serialise up/down/start/stop between concurrent callers (e.g. parallel test runs).
with_lock() {
  exec 9>"$STACK_DIR/.lock"
  flock -w 600 9 || die "could not take $STACK_DIR/.lock"
}

port_open() { # port -> 0 if something accepts TCP connections on 127.0.0.1:port
  timeout 2 bash -c "exec 3<>/dev/tcp/$HOST/$1" 2>/dev/null
}

pid_file() { echo "$STACK_DIR/$1.pid"; }

# Prints the pid recorded for a service if that process is alive and really is ours
# (its command line names this stack dir); removes stale pid files.
managed_pid() {
  local f pid
  f="$(pid_file "$1")"
  [[ -f "$f" ]] || return 1
  pid="$(cat "$f" 2>/dev/null || true)"
  if [[ "$pid" =~ ^[0-9]+$ ]] && [[ -r /proc/$pid/cmdline ]] \
     && tr '\0' ' ' </proc/"$pid"/cmdline | grep -qF -- "$STACK_DIR"; then
    echo "$pid"; return 0
  fi
  rm -f "$f"
  return 1
}

# launch NAME LOGFILE CMD... : detached (own session, survives the calling shell), pid file written.
launch() {
  local name="$1" logfile="$2"; shift 2
  : >>"$logfile"
  printf '\n===== %s starting at %s =====\n' "$name" "$(date -Is)" >>"$logfile"
  # shellcheck disable=SC2016  # $$ and $@ expand in the child shell
  setsid bash -c 'echo $$ >"$1"; shift; exec "$@"' _ "$(pid_file "$name")" "$@" \
    </dev/null >>"$logfile" 2>&1 9>&- &
  local _
  for _ in $(seq 1 50); do [[ -s "$(pid_file "$name")" ]] && return 0; sleep 0.1; done
  die "$name: no pid file after launch"
}

stop_pid() { # name pid timeout_s
  local name="$1" pid="$2" t="$3" waited=0
  kill -TERM "$pid" 2>/dev/null || true
  while kill -0 "$pid" 2>/dev/null; do
    if (( waited >= t * 10 )); then
      log "$name: still running after ${t}s, sending SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
      sleep 0.5
      break
    fi
    sleep 0.1; waited=$((waited + 1))
  done
  rm -f "$(pid_file "$name")"
}

# ----------------------------------------------------------------------------- deps
apt_missing() {
  local p missing=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  echo "${missing[@]:-}"
}

deps_apt() {
  local pkgs=("$@")
  (( ${#pkgs[@]} )) || pkgs=("${APT_PACKAGES[@]}")
  command -v java >/dev/null 2>&1 || [[ -n "${JAVA_HOME:-}" ]] || pkgs+=(openjdk-17-jdk-headless)
  command -v mvn >/dev/null 2>&1 || pkgs+=(maven)
  command -v flock >/dev/null 2>&1 || pkgs+=(util-linux)
  local missing
  missing="$(apt_missing "${pkgs[@]}")"
  if [[ -z "${missing// /}" ]]; then
    log "apt: all packages present"
    return 0
  fi
  log "apt: installing $missing"
  local sudo=()
  [[ $(id -u) -eq 0 ]] || sudo=(sudo)
  "${sudo[@]}" apt-get update -qq
  # shellcheck disable=SC2086
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends $missing
  # The Debian package may start its own mariadb service (port 3306, /run/mysqld);
  # this stack runs its own server, so stop the packaged one if it came up.
  if command -v service >/dev/null 2>&1 && [[ " $missing " == *" mariadb-server "* ]]; then
    "${sudo[@]}" service mariadb stop >/dev/null 2>&1 || true
  fi
}

pom_stamp() { cksum <"$KAFKA_POM" | awk '{print $1 "-" $2}'; }

deps_kafka() {
  local stamp; stamp="$(pom_stamp)"
  if [[ -f "$KAFKA_LIB/.complete" && "$(cat "$KAFKA_LIB/.complete")" == "$stamp" ]]; then
    log "kafka jars: present ($KAFKA_LIB)"
    return 0
  fi
  log "kafka jars: resolving with Maven into $KAFKA_LIB"
  rm -rf "$KAFKA_LIB"
  mkdir -p "$KAFKA_LIB"
  run_mvn -f "$KAFKA_POM" dependency:copy-dependencies -Dkafka.lib.dir="$KAFKA_LIB" \
    || die "Maven could not resolve the Kafka jars"
  ls "$KAFKA_LIB"/kafka_2.13-*.jar >/dev/null 2>&1 || die "kafka_2.13 jar missing in $KAFKA_LIB"
  echo "$stamp" >"$KAFKA_LIB/.complete"
}

deps_apicurio() {
  if [[ -f "$APICURIO_HOME/.complete" && -f "$APICURIO_HOME/quarkus-run.jar" ]]; then
    log "apicurio $APICURIO_VERSION: present ($APICURIO_HOME)"
    return 0
  fi
  local dl="$STACK_DIR/downloads" tgz
  tgz="$dl/apicurio-registry-app-$APICURIO_VERSION-all.tar.gz"
  mkdir -p "$dl"
  if [[ ! -s "$tgz" ]]; then
    log "apicurio: fetching $APICURIO_ARTIFACT with Maven"
    run_mvn -f "$KAFKA_POM" dependency:copy@apicurio \
      -Dapicurio.version="$APICURIO_VERSION" -Ddownload.dir="$dl" \
      || die "Maven could not fetch $APICURIO_ARTIFACT"
  fi
  [[ -s "$tgz" ]] || die "expected $tgz after download"
  log "apicurio: unpacking into $APICURIO_HOME"
  rm -rf "$APICURIO_HOME.tmp" "$APICURIO_HOME"
  mkdir -p "$APICURIO_HOME.tmp"
  tar -xzf "$tgz" -C "$APICURIO_HOME.tmp"
  [[ -f "$APICURIO_HOME.tmp/quarkus-run.jar" ]] || die "quarkus-run.jar not found in $tgz"
  mv "$APICURIO_HOME.tmp" "$APICURIO_HOME"
  touch "$APICURIO_HOME/.complete"
}

cmd_deps() {
  with_lock
  deps_apt
  deps_kafka
  deps_apicurio
  local rj
  if rj="$(registry_java_bin)"; then
    log "registry java: $rj (Java $(java_major "$rj"))"
  else
    # Debian 12 packages only OpenJDK 17; a Java 21+ must come with the machine (here: Temurin under /usr/lib/jvm).
    log "WARNING: no Java $REGISTRY_MIN_JAVA+ found for Apicurio Registry $APICURIO_VERSION; set ORDERPIPE_REGISTRY_JAVA_HOME"
    return 1
  fi
}

ensure_kafka_jars() { [[ -f "$KAFKA_LIB/.complete" && "$(cat "$KAFKA_LIB/.complete")" == "$(pom_stamp)" ]] || deps_kafka; }

# ----------------------------------------------------------------------------- kafka
KAFKA_LOG4J="$KAFKA_DIR/log4j2.properties"
TOOLS_LOG4J="$STACK_DIR/lib/tools-log4j2.properties"

write_tools_log4j() {
  mkdir -p "$(dirname "$TOOLS_LOG4J")"
  [[ -f "$TOOLS_LOG4J" ]] && return 0
  cat >"$TOOLS_LOG4J.tmp" <<'EOF'
# log4j2 for Kafka command-line tools run by dev/stack.sh kafka-class: warnings to stderr.
status = warn
appender.stderr.type = Console
appender.stderr.name = STDERR
appender.stderr.target = SYSTEM_ERR
appender.stderr.layout.type = PatternLayout
appender.stderr.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.stderr.ref = STDERR
EOF
  mv "$TOOLS_LOG4J.tmp" "$TOOLS_LOG4J"
}

write_kafka_config() {
  mkdir -p "$KAFKA_DATA"
  cat >"$KAFKA_DIR/server.properties" <<EOF
# Generated by dev/stack.sh; edits are overwritten on the next start.
# Single-node KRaft: this process is both broker and controller.
process.roles=broker,controller
node.id=1
controller.quorum.bootstrap.servers=$HOST:$KAFKA_CONTROLLER_PORT
listeners=PLAINTEXT://$HOST:$KAFKA_PORT,CONTROLLER://$HOST:$KAFKA_CONTROLLER_PORT
advertised.listeners=PLAINTEXT://$HOST:$KAFKA_PORT,CONTROLLER://$HOST:$KAFKA_CONTROLLER_PORT
inter.broker.listener.name=PLAINTEXT
controller.listener.names=CONTROLLER
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
log.dirs=$KAFKA_DATA

# Topics: the application creates its own topics.
auto.create.topics.enable=false
delete.topic.enable=true
num.partitions=1
default.replication.factor=1
min.insync.replicas=1
num.network.threads=3
num.io.threads=4
log.retention.hours=24
log.segment.bytes=134217728

# Internal topics on a single node (consumer offsets, transactions, share groups).
offsets.topic.replication.factor=1
offsets.topic.num.partitions=10
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=10
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1

# Consumer groups: no join delay; both the classic and the new (KIP-848) protocol.
group.initial.rebalance.delay.ms=0
group.coordinator.rebalance.protocols=classic,consumer
# New-protocol groups: detect a dead member after 10 s instead of 45 s (tests kill consumers).
group.consumer.min.session.timeout.ms=6000
group.consumer.session.timeout.ms=10000
group.consumer.min.heartbeat.interval.ms=1000
group.consumer.heartbeat.interval.ms=2000
EOF
  cat >"$KAFKA_LOG4J" <<EOF
# Generated by dev/stack.sh. Kafka broker logging (log4j2): $KAFKA_DIR/server.log
status = warn
appender.server.type = RollingFile
appender.server.name = SERVER
appender.server.fileName = $KAFKA_DIR/server.log
appender.server.filePattern = $KAFKA_DIR/server.log.%i
appender.server.layout.type = PatternLayout
appender.server.layout.pattern = [%d] %p %m (%c)%n
appender.server.policies.type = Policies
appender.server.policies.size.type = SizeBasedTriggeringPolicy
appender.server.policies.size.size = 50MB
appender.server.strategy.type = DefaultRolloverStrategy
appender.server.strategy.max = 3
rootLogger.level = INFO
rootLogger.appenderRef.server.ref = SERVER
logger.request.name = kafka.request.logger
logger.request.level = WARN
logger.statechange.name = state.change.logger
logger.statechange.level = WARN
EOF
}

kafka_java() { # run a JVM on the Kafka class path (tools logging); JVM opts: ORDERPIPE_KAFKA_TOOLS_OPTS
  write_tools_log4j
  # shellcheck disable=SC2086
  "$(java_bin)" ${ORDERPIPE_KAFKA_TOOLS_OPTS:--Xms64m -Xmx512m} \
    -Dlog4j2.configurationFile="$TOOLS_LOG4J" -cp "$KAFKA_LIB/*" "$@"
}

# Short-lived internal tool runs (format, readiness): C1 only + serial GC start faster.
kafka_java_quick() {
  ORDERPIPE_KAFKA_TOOLS_OPTS="-Xms32m -Xmx256m -XX:+UseSerialGC -XX:TieredStopAtLevel=1" kafka_java "$@"
}

# Kafka wire-protocol ApiVersions(v0) request over bash /dev/tcp: answers in ~10 ms without a JVM.
kafka_answers() {
  local out
  out="$(timeout 5 bash -c '
    exec 3<>/dev/tcp/'"$HOST/$KAFKA_PORT"' || exit 1
    # size=12 | api_key=18 ApiVersions | version=0 | correlation_id=42 | client_id="op"
    printf "\x00\x00\x00\x0c\x00\x12\x00\x00\x00\x00\x00\x2a\x00\x02op" >&3
    head -c 10 <&3 | od -An -tx1' 2>/dev/null)" || return 1
  out="${out//[[:space:]]/}"
  # response: size(4) | correlation_id=42 | error_code=0
  [[ "$out" =~ ^[0-9a-f]{8}0000002a0000$ ]]
}

kafka_launch() {
  local java; java="$(java_bin)"
  ensure_kafka_jars
  write_kafka_config
  if [[ ! -f "$KAFKA_DATA/meta.properties" ]]; then
    local cid
    if [[ -s "$KAFKA_DIR/cluster.id" ]]; then cid="$(cat "$KAFKA_DIR/cluster.id")"
    else cid="$(kafka_java_quick kafka.tools.StorageTool random-uuid)"; echo "$cid" >"$KAFKA_DIR/cluster.id"; fi
    log "kafka: formatting $KAFKA_DATA (cluster id $cid, standalone KRaft quorum)"
    kafka_java_quick kafka.tools.StorageTool format --config "$KAFKA_DIR/server.properties" \
      --cluster-id "$cid" --standalone --ignore-formatted >>"$KAFKA_DIR/format.log" 2>&1 \
      || { tail -n 30 "$KAFKA_DIR/format.log" >&2; die "kafka: storage format failed"; }
  fi
  launch kafka "$KAFKA_DIR/kafka.out.log" "$java" \
    -Xms256m "-Xmx$KAFKA_HEAP" -server -XX:+UseG1GC -XX:MaxGCPauseMillis=20 \
    -XX:InitiatingHeapOccupancyPercent=35 -XX:+ExplicitGCInvokesConcurrent -Djava.awt.headless=true \
    -Dlog4j2.configurationFile="$KAFKA_LOG4J" -Dkafka.logs.dir="$KAFKA_DIR" \
    -cp "$KAFKA_LIB/*" kafka.Kafka "$KAFKA_DIR/server.properties"
}

kafka_ready_after_start() {
  # A real metadata round trip through the admin client (lists topics).
  kafka_java_quick org.apache.kafka.tools.TopicCommand --bootstrap-server "$HOST:$KAFKA_PORT" --list \
    >/dev/null 2>>"$KAFKA_DIR/kafka.out.log"
}

kafka_logs() { echo "$KAFKA_DIR/kafka.out.log" "$KAFKA_DIR/server.log"; }

# ----------------------------------------------------------------------------- registry
registry_answers() {
  [[ "$(curl -s -o /dev/null -m 3 -w '%{http_code}' "$REGISTRY_URL/subjects" 2>/dev/null)" == 200 ]]
}

registry_launch() {
  [[ -f "$APICURIO_HOME/.complete" ]] || deps_apicurio
  mkdir -p "$REGISTRY_DIR"
  local compat_opts=()
  if [[ "$REGISTRY_COMPAT" != NONE ]]; then
    compat_opts=("-Dapicurio.rules.global.compatibility=$REGISTRY_COMPAT")
  fi
  # In-memory storage (the 3.x default: apicurio.storage.kind=sql + H2 mem); schemas are lost on stop.
  local rjava
  rjava="$(registry_java_bin)" || die "registry: Apicurio Registry $APICURIO_VERSION needs Java $REGISTRY_MIN_JAVA+;" \
    "none found (set ORDERPIPE_REGISTRY_JAVA_HOME; checked JAVA_HOME, PATH, /usr/lib/jvm/*)"
  ( cd "$REGISTRY_DIR" && launch registry "$REGISTRY_DIR/registry.log" "$rjava" \
      -Xms128m "-Xmx$REGISTRY_HEAP" -XX:+UseG1GC -Djava.awt.headless=true \
      -Dorderpipe.stack="$STACK_DIR" \
      -Dquarkus.http.host="$HOST" -Dquarkus.http.port="$REGISTRY_PORT" \
      -Dquarkus.management.host="$HOST" -Dquarkus.management.port="$REGISTRY_MGMT_PORT" \
      -Dapicurio.storage.kind=sql -Dapicurio.storage.sql.kind=h2 \
      -Dapicurio.storage.snapshot.location="$REGISTRY_DIR" \
      -Dapicurio.rest.deletion.group.enabled=true \
      -Dapicurio.rest.deletion.artifact.enabled=true \
      -Dapicurio.rest.deletion.artifact-version.enabled=true \
      "${compat_opts[@]}" \
      -jar "$APICURIO_HOME/quarkus-run.jar" )
}

registry_ready_after_start() {
  [[ "$REGISTRY_COMPAT" == NONE ]] && return 0
  # Global compatibility rule through the Confluent-compatible API as well: makes the
  # setting visible at GET /config and survives any change in how the -D rule is read.
  local body
  body="$(curl -sS -m 10 -X PUT -H 'Content-Type: application/json' \
          -d "{\"compatibility\":\"$REGISTRY_COMPAT\"}" "$REGISTRY_URL/config")" \
    || { log "registry: PUT /config failed"; return 1; }
  [[ "$body" == *"$REGISTRY_COMPAT"* ]] || { log "registry: PUT /config answered: $body"; return 1; }
}

registry_logs() { echo "$REGISTRY_DIR/registry.log"; }

# ----------------------------------------------------------------------------- mariadb
mariadb_answers() {
  mariadb --no-defaults --protocol=TCP -h"$HOST" -P"$MARIADB_PORT" -u"$DB_USER" -p"$DB_PASS" \
    --connect-timeout=3 -N -e 'select 1' >/dev/null 2>&1
}

mariadb_root() { mariadb --no-defaults --socket="$MARIADB_SOCK" -uroot "$@"; }

write_mariadb_config() {
  mkdir -p "$MARIADB_DIR"
  cat >"$MARIADB_DIR/my.cnf" <<EOF
# Generated by dev/stack.sh; edits are overwritten on the next start.
[mariadbd]
user=root
datadir=$MARIADB_DATA
socket=$MARIADB_SOCK
pid-file=$MARIADB_DIR/mariadbd.pid
log-error=$MARIADB_DIR/mariadb.log
bind-address=$HOST
port=$MARIADB_PORT
tmpdir=$MARIADB_DIR/tmp
skip-name-resolve
character-set-server=utf8mb4
collation-server=utf8mb4_general_ci
# Sized for the benchmarks' 1M-event backlogs (dedup rows and their
# indexes stay in memory); durability stays on: fsync per commit.
innodb_buffer_pool_size=1G
innodb_log_file_size=512M
innodb_flush_log_at_trx_commit=1
max_connections=500
max_allowed_packet=64M
# Row-based binlog with GTIDs for orderpipe cdc (it connects as a replica);
# full row images so updates carry every column before and after, full row
# metadata so each table map names its columns and primary key. sync_binlog=1:
# a commit is durable in the binlog too. Binlogs kept 1 day, like Kafka's retention.
log_bin=mariadb-bin
binlog_format=ROW
binlog_row_image=FULL
binlog_row_metadata=FULL
server_id=1
gtid_strict_mode=1
sync_binlog=1
binlog_expire_logs_seconds=86400
EOF
  mkdir -p "$MARIADB_DIR/tmp"
}

mariadb_launch() {
  command -v mariadbd >/dev/null 2>&1 || [[ -x /usr/sbin/mariadbd ]] || deps_apt
  local mariadbd; mariadbd="$(command -v mariadbd || echo /usr/sbin/mariadbd)"
  write_mariadb_config
  if [[ ! -d "$MARIADB_DATA/mysql" ]]; then
    log "mariadb: initialising $MARIADB_DATA"
    rm -rf "$MARIADB_DATA"
    mariadb-install-db --no-defaults --user=root --basedir=/usr --datadir="$MARIADB_DATA" \
      --auth-root-authentication-method=socket --skip-test-db >"$MARIADB_DIR/install-db.log" 2>&1 \
      || { tail -n 30 "$MARIADB_DIR/install-db.log" >&2; die "mariadb: mariadb-install-db failed"; }
  fi
  launch mariadb "$MARIADB_DIR/mariadb.out.log" "$mariadbd" --defaults-file="$MARIADB_DIR/my.cnf"
}

mariadb_ready_after_start() { :; }

# Called while waiting: once the root socket answers, make sure database and user exist.
mariadb_bootstrap() {
  mariadb_root -N -e 'select 1' >/dev/null 2>&1 || return 1
  mariadb_root <<EOF
CREATE DATABASE IF NOT EXISTS \`$DB_NAME\`;
CREATE USER IF NOT EXISTS '$DB_USER'@'%' IDENTIFIED BY '$DB_PASS';
CREATE USER IF NOT EXISTS '$DB_USER'@'localhost' IDENTIFIED BY '$DB_PASS';
CREATE USER IF NOT EXISTS '$DB_USER'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
GRANT ALL PRIVILEGES ON *.* TO '$DB_USER'@'%' WITH GRANT OPTION;
GRANT ALL PRIVILEGES ON *.* TO '$DB_USER'@'localhost' WITH GRANT OPTION;
GRANT ALL PRIVILEGES ON *.* TO '$DB_USER'@'127.0.0.1' WITH GRANT OPTION;
EOF
}

mariadb_logs() { echo "$MARIADB_DIR/mariadb.log" "$MARIADB_DIR/mariadb.out.log"; }

# ----------------------------------------------------------------------------- service orchestration
svc_port() {
  case "$1" in kafka) echo "$KAFKA_PORT" ;; registry) echo "$REGISTRY_PORT" ;; mariadb) echo "$MARIADB_PORT" ;; esac
}
svc_endpoint() {
  case "$1" in
    kafka) echo "kafka     $HOST:$KAFKA_PORT (PLAINTEXT, controller $HOST:$KAFKA_CONTROLLER_PORT)" ;;
    registry) echo "registry  $REGISTRY_URL" ;;
    mariadb) echo "mariadb   mysql://$DB_USER:***@$HOST:$MARIADB_PORT/$DB_NAME" ;;
  esac
}
svc_stop_timeout() { case "$1" in mariadb) echo 120 ;; kafka) echo 60 ;; *) echo 30 ;; esac; }
check_service() { case "${1:-}" in kafka|registry|mariadb) ;; *) die "unknown service '${1:-}' (kafka|registry|mariadb)" ;; esac; }

declare -A LAUNCHED_AT=()

# Phase 1: launch if needed (does not wait). Sets LAUNCHED_AT[svc].
svc_begin() {
  local s="$1" pid
  if "${s}_answers"; then
    if pid="$(managed_pid "$s")"; then log "$s: already up (pid $pid, reused)"
    else log "$s: already answering on port $(svc_port "$s") (not started by this script; reused)"; fi
    return 0
  fi
  if pid="$(managed_pid "$s")"; then
    log "$s: pid $pid is running but not answering yet; waiting for it"
    LAUNCHED_AT[$s]=$SECONDS
    return 0
  fi
  if port_open "$(svc_port "$s")"; then
    die "$s: port $HOST:$(svc_port "$s") is taken by something that does not answer like $s"
  fi
  LAUNCHED_AT[$s]=$SECONDS
  "${s}_launch"
  log "$s: launched (pid $(cat "$(pid_file "$s")"))"
}

svc_fail() {
  local s="$1" msg="$2" f
  log "$s: $msg"
  for f in $("${s}_logs"); do
    [[ -f "$f" ]] || continue
    printf -- '----- last 40 lines of %s -----\n' "$f" >&2
    tail -n 40 "$f" >&2
  done
  local pid
  if pid="$(managed_pid "$s")"; then
    log "$s: stopping pid $pid"
    stop_pid "$s" "$pid" "$(svc_stop_timeout "$s")"
  fi
  exit 1
}

# Phase 2: wait until a launched service answers, then run its post-start step.
svc_wait() {
  local s="$1"
  [[ -n "${LAUNCHED_AT[$s]:-}" ]] || return 0
  local start="${LAUNCHED_AT[$s]}" deadline=$(( ${LAUNCHED_AT[$s]} + TIMEOUT ))
  local bootstrapped=0
  while :; do
    # MariaDB: once the root socket answers, create the database and user (idempotent), once.
    if [[ "$s" == mariadb ]] && (( ! bootstrapped )); then
      if mariadb_bootstrap >/dev/null 2>&1; then bootstrapped=1; fi
    fi
    if "${s}_answers"; then break; fi
    if ! managed_pid "$s" >/dev/null; then svc_fail "$s" "process exited during startup"; fi
    if (( SECONDS >= deadline )); then svc_fail "$s" "did not answer within ${TIMEOUT}s"; fi
    sleep 0.5
  done
  if ! "${s}_ready_after_start"; then svc_fail "$s" "answers, but the post-start check failed"; fi
  log "$s: up after $(( SECONDS - start ))s -> $(svc_endpoint "$s")"
  unset "LAUNCHED_AT[$s]"
}

svc_stop() {
  local s="$1" pid
  if pid="$(managed_pid "$s")"; then
    log "$s: stopping pid $pid"
    local t0=$SECONDS
    stop_pid "$s" "$pid" "$(svc_stop_timeout "$s")"
    log "$s: stopped after $(( SECONDS - t0 ))s"
  elif "${s}_answers"; then
    log "$s: answering on port $(svc_port "$s") but not started by this script; left alone"
  else
    log "$s: not running"
  fi
}

# A crash, as a node failure or the OOM killer: no controlled shutdown.
svc_kill() {
  local s="$1" pid
  pid="$(managed_pid "$s")" || { log "$s: not running (or not started by this script)"; return 0; }
  log "$s: SIGKILL pid $pid"
  kill -KILL "$pid" 2>/dev/null || true
  while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
  rm -f "$(pid_file "$s")"
}

cmd_up() {
  with_lock
  local s
  for s in "$@"; do svc_begin "$s"; done
  for s in "$@"; do svc_wait "$s"; done
}

cmd_down() {
  with_lock
  local s
  # registry and kafka in parallel would be faster, but ordered stops keep logs readable;
  # kafka first so producers/consumers see the broker go away before the DB.
  for s in "$@"; do svc_stop "$s"; done
}

cmd_status() {
  local s rc=0 state who pid
  for s in "${SERVICES[@]}"; do
    if "${s}_answers"; then state=up; else state=down; rc=1; fi
    if pid="$(managed_pid "$s")"; then who="pid $pid"; elif [[ $state == up ]]; then who="external"; else who="-"; fi
    printf '%-5s %s  [%s]\n' "$state" "$(svc_endpoint "$s")" "$who"
  done
  return "$rc"
}

cmd_logs() {
  check_service "${1:-}"
  local f
  for f in $("${1}_logs"); do [[ -f "$f" ]] && { echo "==> $f <=="; tail -n "${2:-50}" "$f"; }; done
  return 0
}

cmd_clean() {
  with_lock
  local s
  for s in "${SERVICES[@]}"; do
    managed_pid "$s" >/dev/null && die "$s is running; run dev/stack.sh down first"
  done
  rm -rf "$KAFKA_DIR" "$MARIADB_DIR" "$REGISTRY_DIR"
  log "removed Kafka, MariaDB and registry state (downloads kept)"
}

cmd_kafka_topics() {
  local a has_bootstrap=0
  for a in "$@"; do [[ "$a" == --bootstrap-server* ]] && has_bootstrap=1; done
  ensure_kafka_jars
  if (( has_bootstrap )); then kafka_java org.apache.kafka.tools.TopicCommand "$@"
  else kafka_java org.apache.kafka.tools.TopicCommand --bootstrap-server "$HOST:$KAFKA_PORT" "$@"; fi
}

usage() { awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "${BASH_SOURCE[0]}"; }

main() {
  local cmd="${1:-}"; shift || true
  case "$cmd" in
    deps) cmd_deps ;;
    build-deps) with_lock; deps_apt "${BUILD_PACKAGES[@]}" ;;
    up) cmd_up mariadb kafka registry ;;
    down) cmd_down registry kafka mariadb ;;
    status) cmd_status ;;
    start) check_service "${1:-}"; cmd_up "$1" ;;
    stop) check_service "${1:-}"; cmd_down "$1" ;;
    restart) check_service "${1:-}"; cmd_down "$1"; cmd_up "$1" ;;
    kill) check_service "${1:-}"; with_lock; svc_kill "$1" ;;
    logs) cmd_logs "$@" ;;
    clean) cmd_clean ;;
    kafka-class) [[ $# -ge 1 ]] || die "usage: dev/stack.sh kafka-class CLASS [ARGS...]"
                 ensure_kafka_jars; kafka_java "$@" ;;
    kafka-topics) cmd_kafka_topics "$@" ;;
    sql) mariadb --no-defaults --protocol=TCP -h"$HOST" -P"$MARIADB_PORT" -u"$DB_USER" -p"$DB_PASS" "$@" ;;
    ""|-h|--help|help) usage ;;
    *) usage >&2; die "unknown command '$cmd'" ;;
  esac
}

main "$@"
