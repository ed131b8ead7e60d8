#!/usr/bin/env bash
# Where a consumer's memory and allocations go: `orderpipe consume
# --handler notification` over a COUNT backlog under heaptrack, then a table
# of the allocation sites that hold the most at the heap's peak, and of those
# called most often, each named by its first frame and the first orderpipe
# (src/...) frame under it. Allocation calls per event are the CPU side:
# glibc malloc/free was a third of orderpipe's CPU in `perf` (docs/tuning.md).
#
#   dev/heap-profile.sh [COUNT]   (default 300000; needs `make dev-up`;
#                                  installs Debian's heaptrack if missing)
# Runs under heaptrack are several times slower: read sizes and counts, not rates.
set -euo pipefail
COUNT="${1:-300000}"
source "$(dirname "${BASH_SOURCE[0]}")/bench-common.sh"
if ! command -v heaptrack_print >/dev/null; then
  sudo=(); [[ $(id -u) -eq 0 ]] || sudo=(sudo)
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends heaptrack
fi

echo "== backlog: $COUNT events in $TOPIC"
"$BIN" topics ensure --group "$RUN_ID-heap" >/dev/null
"$BIN" produce --count "$COUNT" --orders 10000 --seed 1 --output json >/dev/null
mkdb "${RUN_ID}_heap"
PROFILE="$OUT_DIR/heap-$RUN_ID"
echo "== orderpipe consume under heaptrack -> $PROFILE.zst"
ORDERPIPE_DATABASE__URL="$DB_URL_BASE/${RUN_ID}_heap" heaptrack -o "$PROFILE" \
  "$BIN" --log-level off consume --group "$RUN_ID-heap" --handler notification --until-idle 5 \
  --output json > "$PROFILE.json" 2> "$PROFILE.log" \
  || { tail -20 "$PROFILE.log" >&2; exit 1; }
heaptrack_print -f "$PROFILE.zst" --print-peaks 1 --print-allocators 1 --print-temporary 0 \
  --print-leaks 0 --peak-limit 12 --sub-peak-limit 8 > "$PROFILE.txt" 2>/dev/null
SQL -e "DROP DATABASE ${RUN_ID}_heap"

python3 - "$PROFILE.txt" "$PROFILE.json" "$ROOT" <<'EOF'
import json, os, re, sys
ROOT = sys.argv[3]
text = open(sys.argv[1]).read().splitlines()
# heaptrack writes its banner to the same stdout as the summary.
summary = open(sys.argv[2]).read()
applied = json.JSONDecoder().raw_decode(summary[summary.index("{"):])[0]["applied"]
UNITS = {"": 1, "K": 1e3, "M": 1e6, "G": 1e9}
def size(s):
    m = re.match(r"([0-9.]+)([KMG]?)", s)
    return float(m.group(1)) * UNITS[m.group(2)]
# heaptrack_print writes sections; in each, an entry line
# ("13.75M consumed over 7533 calls from:" or "763530 calls with 0B peak
# consumption from:") is followed by its stack, one frame per line pair.
def entries(start, end, pattern):
    out, cur = [], None
    for line in text[start:end]:
        m = re.match(pattern, line.strip())
        if m:
            cur = {"m": m, "frames": []}
            out.append(cur)
        elif cur is not None and line.startswith("    ") and not line.strip().startswith(("at ", "in ")):
            cur["frames"].append([line.strip(), None])
        elif cur is not None and line.strip().startswith("at ") and cur["frames"] and cur["frames"][-1][1] is None:
            cur["frames"][-1][1] = line.strip()[3:]
    return out
def ours(loc):
    # Other crates' frames are relative too (rdkafka's src/message.rs):
    # a frame is orderpipe's if its file is in this repository.
    return loc and loc.startswith("src/") and os.path.exists(os.path.join(ROOT, loc.rsplit(":", 1)[0]))
def short(loc):
    loc = loc or "?"
    return loc.rsplit("/", 1)[-1] if loc.startswith("/") else loc
def name(e):
    frames = e["frames"]
    first = f"{frames[0][0]} ({short(frames[0][1])})" if frames else "?"
    mine = next((loc for _, loc in frames if ours(loc)), None)
    return first + (f" <- {mine}" if mine and mine not in first else "")
sec = {k: next(i for i, l in enumerate(text) if l.startswith(k)) for k in ("MOST CALLS", "PEAK MEMORY")}
peak = next(l for l in text if l.startswith("peak heap memory consumption"))
rss = next(l for l in text if l.startswith("peak RSS"))
calls = int(next(l for l in text if l.startswith("calls to allocation functions")).split()[4])
print(f"\n{peak}\n{rss}\nallocation calls: {calls:,} for {applied:,} events applied = {calls / applied:.0f} per event")
ends = sorted(sec.values()) + [len(text)]
def section(key):
    s = sec[key]
    return s, next(e for e in ends if e > s)
print("\nheld at the heap's peak, by allocation site")
print(f"{'held':>8}  {'calls':>10}  site")
rows = entries(*section("PEAK MEMORY"), r"^([0-9.]+[KMG]?)B? consumed over ([0-9]+) calls from:$")
for e in sorted(rows, key=lambda e: -size(e["m"].group(1)))[:12]:
    print(f"{e['m'].group(1):>8}  {int(e['m'].group(2)):>10,}  {name(e)}")
print("\nallocation calls per event, by site")
print(f"{'per event':>9}  {'calls':>10}  site")
rows = entries(*section("MOST CALLS"), r"^([0-9]+) calls with .* from:$")
for e in sorted(rows, key=lambda e: -int(e["m"].group(1)))[:15]:
    n = int(e["m"].group(1))
    print(f"{n / applied:>9.2f}  {n:>10,}  {name(e)}")
EOF
echo "(full report: $PROFILE.txt; heaptrack --analyze $PROFILE.zst)"
