#!/usr/bin/env bash
# `make image`: build the runtime image of the `Dockerfile` without a Docker
# daemon and run it against the dev stack as the chart's non-root user.
#
#   dev/image.sh [all]   build, then check (default)
#   dev/image.sh build   the image only: localhost/orderpipe:dev (ORDERPIPE_IMAGE to rename)
#   dev/image.sh check   run the built image: --version, then a real consume against the dev stack
#   dev/image.sh clean   delete the cached base rootfs and the image storage (next build is cold)
#
# How: buildah builds the Dockerfile itself (`buildah bud`, vfs storage,
# chroot isolation), so its runtime stage (packages, user, entrypoint) is the
# one source of truth for both paths. Two things a registry would give are
# substituted with --build-context, everything else runs as written:
#   - the runtime stage's base (debian:bookworm-slim) is a Debian bookworm
#     minbase rootfs made by mmdebstrap from this machine's apt sources,
#     cached under .stack/image/ (git-ignored);
#   - the `build` stage is the release binary built on this host (same Debian
#     12, so the same glibc and shared libraries as the image).
# The runtime stage's RUN (apt-get install + useradd) runs inside the image as
# with Docker, with the host network, so it needs the Debian mirror.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STACK="$ROOT/dev/stack.sh"
DOCKERFILE="$ROOT/Dockerfile"
VALUES="$ROOT/helm/orderpipe/values.yaml"
WORK="${ORDERPIPE_STACK_DIR:-$ROOT/.stack}/image"
IMAGE="${ORDERPIPE_IMAGE:-localhost/orderpipe:dev}"
HOST_BINARY="$ROOT/target/release/orderpipe"
# The check's synthetic events come from `produce --count`, a harness command
# the release binary (like the image) is built without: a debug build with
# the cargo feature `harness` (make test has built it already).
LOAD_BINARY="$ROOT/target/debug/orderpipe"
SUITE=bookworm
# Like the official -slim images: no docs, man pages or locales; apt keeps no
# binary caches, downloaded .debs or translations in the image.
MMDEBSTRAP_ARGS=(
  --variant=minbase
  --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr
  --dpkgopt='path-exclude=/usr/share/doc/*'
  --dpkgopt='path-include=/usr/share/doc/*/copyright'
  --dpkgopt='path-exclude=/usr/share/man/*'
  --dpkgopt='path-exclude=/usr/share/info/*'
  --dpkgopt='path-exclude=/usr/share/locale/*'
  --dpkgopt='path-exclude=/usr/share/groff/*'
  --dpkgopt='path-exclude=/usr/share/lintian/*'
  --aptopt='Dir::Cache::pkgcache ""'
  --aptopt='Dir::Cache::srcpkgcache ""'
  --aptopt='Acquire::Languages "none"'
  --aptopt='DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb || true"; }'
)
CHECK_GROUP=image-check
CHECK_EVENTS=100

log() { printf '[image] %s\n' "$*" >&2; }
die() { printf '[image] ERROR: %s\n' "$*" >&2; exit 1; }
step() { printf '[image] == %s (at %ss)\n' "$*" "$SECONDS" >&2; }

# buildah on this script's own storage, never the machine's default one.
bah() { buildah --storage-driver vfs --root "$WORK/storage" --runroot "$WORK/run" "$@"; }

# Working containers and background runs this script started; removed on exit.
CONTAINERS=()
BACKGROUND_PID=""
cleanup() {
  if [[ -n "$BACKGROUND_PID" ]] && kill -0 "$BACKGROUND_PID" 2>/dev/null; then
    local p
    for p in $(descendants "$BACKGROUND_PID") "$BACKGROUND_PID"; do kill "$p" 2>/dev/null || true; done
    wait "$BACKGROUND_PID" 2>/dev/null || true
  fi
  local c
  for c in "${CONTAINERS[@]}"; do bah rm "$c" >/dev/null 2>&1 || true; done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# One run at a time on this storage; containers left by a run that was
# killed are removed (nothing else uses this storage).
take_storage() {
  mkdir -p "$WORK"
  exec 9>"$WORK/.lock"
  flock 9
  if [[ -d "$WORK/storage" ]]; then bah rm --all >/dev/null 2>&1 || true; fi
}

# ----------------------------------------------------------------------------- tools
install_tools() {
  "$STACK" build-deps
  local missing=() tool
  for tool in mmdebstrap buildah jq; do
    command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
  done
  (( ${#missing[@]} )) || return 0
  log "apt: installing ${missing[*]}"
  local sudo=()
  [[ $(id -u) -eq 0 ]] || sudo=(sudo)
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

# ----------------------------------------------------------------------------- the Dockerfile
# The runtime stage is the Dockerfile's last one. Its base image and the
# binary it copies from the build stage are what --build-context replaces.
RUNTIME_FROM="" BUILD_STAGE="" BINARY_PATH=""
read_dockerfile() {
  [[ -f "$DOCKERFILE" ]] || die "no Dockerfile at $DOCKERFILE"
  local runtime
  runtime="$(awk 'toupper($1) == "FROM" { stage = "" } { stage = stage $0 "\n" } END { printf "%s", stage }' "$DOCKERFILE")"
  RUNTIME_FROM="$(awk 'toupper($1) == "FROM" { print $2; exit }' <<<"$runtime")"
  local copies
  copies="$(awk 'toupper($1) == "COPY" && $2 ~ /^--from=/ { sub(/^--from=/, "", $2); print $2, $3 }' <<<"$runtime")"
  [[ "$(wc -l <<<"$copies")" -eq 1 && -n "$copies" ]] \
    || die "the Dockerfile's runtime stage must copy exactly one file from the build stage; it has: ${copies:-none}"
  read -r BUILD_STAGE BINARY_PATH <<<"$copies"
  [[ "$RUNTIME_FROM" == debian:"$SUITE"* ]] \
    || die "the Dockerfile's runtime base is '$RUNTIME_FROM'; this script makes a Debian $SUITE rootfs for it: change SUITE here too"
  [[ "$BINARY_PATH" == /* ]] || die "COPY --from=$BUILD_STAGE source must be absolute, got '$BINARY_PATH'"
}

# ----------------------------------------------------------------------------- base
apt_sources() {
  local f
  for f in "${ORDERPIPE_IMAGE_APT_SOURCES:-}" /etc/apt/sources.list.d/debian.sources /etc/apt/sources.list; do
    [[ -n "$f" && -s "$f" ]] && { echo "$f"; return 0; }
  done
  die "no apt sources found (set ORDERPIPE_IMAGE_APT_SOURCES to a sources.list or .sources file)"
}

BASE_IMAGE=""
ensure_base() {
  local sources key tarball
  sources="$(apt_sources)"
  key="$( { printf '%s\n' "$SUITE" "$(dpkg --print-architecture)" "${MMDEBSTRAP_ARGS[@]}"; cat "$sources"; } | sha256sum | cut -c1-12)"
  BASE_IMAGE="localhost/orderpipe-base:$SUITE-$key"
  tarball="$WORK/base/$SUITE-minbase-$key.tar"
  mkdir -p "$WORK/base"
  if [[ -s "$tarball" ]]; then
    log "base rootfs: cached ($tarball)"
  else
    step "base rootfs: mmdebstrap $SUITE minbase from $sources (cold cache: about 1-2 min)"
    rm -f "$WORK"/base/*.tar "$WORK"/base/*.partial
    mmdebstrap --format=tar "${MMDEBSTRAP_ARGS[@]}" "$SUITE" "$tarball.partial" "$sources" >"$WORK/mmdebstrap.log" 2>&1 \
      || { tail -n 30 "$WORK/mmdebstrap.log" >&2; die "mmdebstrap failed (is the Debian mirror in $sources reachable?); log: $WORK/mmdebstrap.log"; }
    mv "$tarball.partial" "$tarball"
    log "base rootfs: $(du -h "$tarball" | cut -f1) in $tarball"
  fi
  if bah inspect --type image "$BASE_IMAGE" >/dev/null 2>&1; then
    log "base image: $BASE_IMAGE (present)"
    return 0
  fi
  step "base image: importing the rootfs as $BASE_IMAGE"
  local ctr
  ctr="$(bah from --quiet scratch)"
  CONTAINERS+=("$ctr")
  bah add --quiet "$ctr" "$tarball" /
  bah config --os linux --arch "$(dpkg --print-architecture)" --cmd /bin/bash \
    --label "org.opencontainers.image.description=Debian $SUITE minbase (mmdebstrap), stands in for $RUNTIME_FROM" "$ctr"
  bah commit --quiet --rm "$ctr" "$BASE_IMAGE" >/dev/null
  CONTAINERS=()
}

# ----------------------------------------------------------------------------- build
os_release() { awk -F= -v key="$1" '$1 == key { gsub(/"/, "", $2); print $2 }' /etc/os-release; }

cmd_build() {
  [[ "$(os_release VERSION_CODENAME)" == "$SUITE" ]] \
    || die "the host binary goes into a Debian $SUITE image, so build it on Debian $SUITE (this is $(os_release PRETTY_NAME))"
  read_dockerfile
  # --locked as in the Dockerfile: a Cargo.lock that docker build would
  # refuse fails here too.
  # The Dockerfile's build stage: the production features (OTLP), no harness.
  step "release binary: cargo build --release --locked --features otlp --bin orderpipe"
  (cd "$ROOT" && cargo build --release --locked --features otlp --bin orderpipe)
  ensure_base

  # The build stage's output, as a directory: the binary at the path the
  # runtime stage copies it from.
  local context="$WORK/build-stage"
  rm -rf "$context"
  mkdir -p "$context$(dirname "$BINARY_PATH")"
  cp -l "$HOST_BINARY" "$context$BINARY_PATH" 2>/dev/null || cp "$HOST_BINARY" "$context$BINARY_PATH"

  step "image: buildah bud $DOCKERFILE -> $IMAGE ($RUNTIME_FROM = $BASE_IMAGE, stage '$BUILD_STAGE' = the host binary)"
  bah bud --isolation chroot --network host --layers --pull=never \
    --build-context "$BUILD_STAGE=$context" \
    --build-context "$RUNTIME_FROM=docker-image://$BASE_IMAGE" \
    -f "$DOCKERFILE" -t "$IMAGE" "$ROOT" >"$WORK/bud.log" 2>&1 \
    || { tail -n 30 "$WORK/bud.log" >&2; die "buildah bud failed; log: $WORK/bud.log"; }
  log "steps: $(grep -c -- '^--> Using cache' "$WORK/bud.log") of $(grep -c '^\[.*STEP' "$WORK/bud.log") from the layer cache"
  log "image: $IMAGE, $(bah images --format '{{.Size}}' "$IMAGE")"
}

# ----------------------------------------------------------------------------- check
sql() { mariadb --protocol=tcp -h 127.0.0.1 -P "${ORDERPIPE_MARIADB_PORT:-3306}" -u orderpipe -porderpipe -N -B -e "$1"; }

# Every descendant pid of $1.
descendants() {
  local pids=("$1") found=() p
  while (( ${#pids[@]} )); do
    local next=()
    for p in "${pids[@]}"; do
      while read -r child; do [[ -n "$child" ]] && next+=("$child"); done < <(ps -o pid= --ppid "$p" 2>/dev/null | tr -d ' ')
    done
    found+=("${next[@]}")
    pids=("${next[@]}")
  done
  echo "${found[@]}"
}

cmd_check() {
  bah inspect --type image "$IMAGE" >/dev/null 2>&1 || die "no image $IMAGE: run dev/image.sh build first"
  [[ -x "$HOST_BINARY" ]] || die "no host binary $HOST_BINARY: run dev/image.sh build first"
  "$STACK" status >/dev/null 2>&1 || die "the dev stack is not up: make dev-up"

  step "image config: user, entrypoint, chart"
  local user chart_user
  user="$(bah inspect --type image --format '{{.OCIv1.Config.User}}' "$IMAGE")"
  chart_user="$(awk '/^podSecurityContext:/ { in_ctx = 1; next } /^[^ ]/ { in_ctx = 0 }
    in_ctx && $1 == "runAsUser:" { u = $2 } in_ctx && $1 == "runAsGroup:" { g = $2 } END { print u ":" g }' "$VALUES")"
  [[ "$user" == "$chart_user" ]] \
    || die "image user '$user' differs from the chart's podSecurityContext runAsUser:runAsGroup '$chart_user'"
  [[ "${user%%:*}" != 0 && -n "${user%%:*}" ]] || die "image user '$user' is root"
  local entrypoint=()
  mapfile -t entrypoint < <(bah inspect --type image --format '{{range .OCIv1.Config.Entrypoint}}{{println .}}{{end}}' "$IMAGE" | sed '/^$/d')
  (( ${#entrypoint[@]} )) || die "image $IMAGE has no entrypoint"
  log "user $user (= chart), entrypoint ${entrypoint[*]}"

  local ctr container_env=()
  ctr="$(bah from --quiet --pull=never "$IMAGE")"
  CONTAINERS+=("$ctr")
  # The image's entrypoint with ARGS, as UID:GID $user, on the host network
  # (the dev stack listens on 127.0.0.1).
  run_image() { bah run --isolation chroot --network host --user "$user" "${container_env[@]}" "$ctr" -- "${entrypoint[@]}" "$@"; }

  step "orderpipe --version in the image"
  local got want
  got="$(run_image --version)"
  want="$("$HOST_BINARY" --version)"
  [[ "$got" == "$want" ]] || die "image says '$got', host binary says '$want'"
  log "$got"

  step "consume --until-idle in the image against the dev stack"
  local id db
  id="img$(date +%s)$RANDOM"
  db="op_$id"
  local host_env=(
    "ORDERPIPE_TOPICS__ORDER_EVENTS__NAME=$id.order.events.v1"
    "ORDERPIPE_TOPICS__INVENTORY_EVENTS__NAME=$id.inventory.events.v1"
    "ORDERPIPE_TOPICS__DEAD_LETTER__NAME=$id.order.events.v1.dlq"
    "ORDERPIPE_DATABASE__URL=mysql://orderpipe:orderpipe@127.0.0.1:${ORDERPIPE_MARIADB_PORT:-3306}/$db"
    "RUST_LOG=warn"
  )
  local kv
  for kv in "${host_env[@]}"; do container_env+=(-e "$kv"); done
  sql "CREATE DATABASE \`$db\`"
  log "database $db, topics $id.*"
  env "${host_env[@]}" "$HOST_BINARY" topics ensure --group "$CHECK_GROUP" >/dev/null
  (cd "$ROOT" && cargo build --quiet --features harness --bin orderpipe)
  env "${host_env[@]}" "$LOAD_BINARY" produce --count "$CHECK_EVENTS" --orders 20 >/dev/null
  log "host: produced $CHECK_EVENTS events"

  local summary="$WORK/consume.json" err="$WORK/consume.log"
  run_image consume --group "$CHECK_GROUP" --handler inventory,payment,logistics,notification,points \
    --migrate --until-idle 3 --output json >"$summary" 2>"$err" &
  BACKGROUND_PID=$!
  # The consumer as the kernel sees it: its real, effective, saved and
  # filesystem ids (the Uid:/Gid: lines of /proc/PID/status).
  local ids="" p
  while kill -0 "$BACKGROUND_PID" 2>/dev/null; do
    for p in $(descendants "$BACKGROUND_PID"); do
      if [[ "$(cat "/proc/$p/comm" 2>/dev/null)" == orderpipe ]]; then
        ids="$(awk '$1 == "Uid:" || $1 == "Gid:" { print $1, $2, $3, $4, $5 }' "/proc/$p/status" 2>/dev/null || true)"
        [[ -n "$ids" ]] && break 2
      fi
    done
    sleep 0.2
  done
  local rc=0
  wait "$BACKGROUND_PID" || rc=$?
  BACKGROUND_PID=""
  (( rc == 0 )) || { cat "$err" >&2; die "consume in the image exited $rc (database $db kept)"; }
  [[ -n "$ids" ]] || die "never saw the consumer process to read its uid"
  local uid="${user%%:*}" gid="${user##*:}"
  [[ "$ids" == "Uid: $uid $uid $uid $uid"$'\n'"Gid: $gid $gid $gid $gid" ]] \
    || die "the consumer ran as '$ids', not $user"
  log "consumer process ran as uid $uid gid $gid (real, effective, saved, fs)"

  local consumed applied rows
  consumed="$(jq -r '.consumed' "$summary")"
  applied="$(jq -r '.applied' "$summary")"
  rows="$(sql "SELECT COUNT(*) FROM \`$db\`.applied_events WHERE consumer_group = '$CHECK_GROUP'")"
  [[ "$consumed" == "$CHECK_EVENTS" && "$applied" == "$CHECK_EVENTS" ]] \
    || die "consume summary: consumed $consumed, applied $applied, expected $CHECK_EVENTS: $(cat "$summary")"
  [[ "$rows" == "$CHECK_EVENTS" ]] \
    || die "event_dedup holds $rows rows for $CHECK_GROUP in $db, expected $CHECK_EVENTS"
  log "consumed $consumed, applied $applied; event_dedup rows for $CHECK_GROUP (read on the host): $rows"

  sql "DROP DATABASE \`$db\`"
  "$STACK" kafka-topics --delete --topic "$id\\..*" >/dev/null 2>&1 || log "could not delete topics $id.* (harmless)"
  step "image OK: $IMAGE runs as $user and consumes from the dev stack"
}

cmd_clean() {
  if [[ -d "$WORK/storage" ]]; then
    bah rm --all >/dev/null 2>&1 || true
    bah rmi --all --force >/dev/null 2>&1 || true
  fi
  rm -rf "$WORK"
  log "removed $WORK (base rootfs cache and image storage)"
}

case "${1:-all}" in
  all) take_storage; install_tools; cmd_build; cmd_check ;;
  build) take_storage; install_tools; cmd_build ;;
  check) take_storage; install_tools; cmd_check ;;
  clean) take_storage; cmd_clean ;;
  *) die "unknown command '${1}' (all|build|check|clean)" ;;
esac
