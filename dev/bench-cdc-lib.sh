# Sourced (after dev/bench-common.sh and dev/debezium-lib.sh's dbz_run, which set WORK and RUN_ID)
# by dev/bench-cdc.sh and dev/bench-cdc-snapshot.sh: read_committed consumers that stamp each
# record's arrival, and what the stamps say (rows/s, commit -> consumer lag).
# stamp TOPIC N OUT: a read_committed console consumer of TOPIC, each record's key stamped with its
# arrival time (µs) into OUT, until N records; runs in the background, CONSUMER_PID.
stamp() {
  "$STACK" kafka-class org.apache.kafka.tools.consumer.ConsoleConsumer --bootstrap-server "$BOOTSTRAP" \
    --topic "$1" --from-beginning --max-messages "$2" --isolation-level read_committed \
    --consumer-property fetch.max.wait.ms=10 --consumer-property group.id="$RUN_ID-$(basename "$3")" \
    --property print.key=true --property print.value=false --property print.timestamp=true \
    2>> "$WORK/consumer.err" \
    | python3 -u -c '
import re, sys, time
# "CreateTime:<ms>\t<key>": arrival (µs), key, CreateTime (ms)
with open(sys.argv[1], "w") as out:
    for line in sys.stdin:
        m = re.match(r"CreateTime:(-?\d+)\t\D*(-?\d+)", line)
        if m:
            out.write(f"{time.time_ns() // 1000}\t{m.group(2)}\t{m.group(1)}\n"); out.flush()' "$3" &
  CONSUMER_PID=$!
  sleep 6  # the JVM starts and joins before the first change arrives
}
wait_stamps() { # wait_stamps FILE N TIMEOUT_S
  for _ in $(seq $(( $3 * 10 ))); do [ "$(wc -l < "$1")" -ge "$2" ] && return 0; sleep 0.1; done
  echo "only $(wc -l < "$1") of $2 records arrived in $3 s" >&2; return 1
}
# rate FILE: rows/s over the last 90 % of the arrivals (the first 10 % include start-up and the
# first batch arriving at once, for both).
rate() { python3 -c '
import sys
t = sorted(int(l.split()[0]) for l in open(sys.argv[1]))
first = len(t) // 10
print(f"{(len(t) - 1 - first) / max((t[-1] - t[first]) / 1e6, 1e-9):.0f}")' "$1"; }
# lag STAMPS: p50 p99 max (ms) of commit -> consumed, then p50 p99 of commit -> produced and of
# produced -> consumed (CreateTime has ms resolution), then the number of records whose CreateTime
# comes before their commit stamp by over 1 ms (a CreateTime not taken at send time).
# Also writes the commit -> consumed latencies to OUT (labelled LABEL) for the report's CDF.
lag() { python3 - "${WRITTEN:-$WORK/written.tsv}" "$1" "$2" "$3" <<'PY'
import sys
written = {k: int(us) for k, us in (l.split()[:2] for l in open(sys.argv[1]))}
total, to_kafka, to_consumer = [], [], []
for at, k, created_ms in (l.split() for l in open(sys.argv[2])):
    if k == "-1":  # the untimed warm-up row
        continue
    w, at, created = written[k], int(at), int(created_ms) * 1000
    total.append((at - w) / 1000)
    to_kafka.append((created - w) / 1000)
    to_consumer.append((at - created) / 1000)
def q(xs, p):
    xs = sorted(xs)
    return xs[min(int(p * (len(xs) - 1) + 0.5), len(xs) - 1)]
odd = sum(1 for x in to_kafka if x < -1)
with open(sys.argv[3], "w") as out:
    out.write(f"# label: {sys.argv[4]}\n" + "".join(f"{x:.3f}\n" for x in total))
print(f"{q(total, .5):.1f} {q(total, .99):.1f} {max(total):.1f} "
      f"{q(to_kafka, .5):.1f} {q(to_kafka, .99):.1f} {q(to_consumer, .5):.1f} {q(to_consumer, .99):.1f} {odd}")
PY
}
