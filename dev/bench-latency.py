#!/usr/bin/env python3
"""Helpers of dev/bench-latency.sh (standard library only).

  join API_STAMPS APPLIED_STAMPS SENT_MS OUT_MS LABEL
      Joins the order API's and the consumer's after-commit stamps
      (`<event_id>\t<µs>` lines, harness::latency) on the event id; writes
      each event's API-commit -> consumer-commit latency in ms to OUT_MS
      (one a line, after a `# label:` line, for the report's CDF) and
      prints JSON: n, p50/p90/p99/p99.9/max from a log-linear (HDR-style)
      histogram, how many events each side stamped, and two splits: at the
      record's Kafka timestamp (the consumer's third column: the relay's
      produce time) and at the relay's mark (SENT_MS: `<event_id>\t<sent_ms>`
      lines from outbox_messages).
  scrape URL
      Prints a /metrics page's histograms as JSON: {name: {le: count, ...,
      "sum": s, "count": n}}, summed over labels but `stage` (name:stage).
  histo BEFORE AFTER NAME
      p50/p99/mean of a Prometheus histogram between two `scrape` outputs.
  slope SAMPLES
      Least-squares slope per second of each column of `t<TAB>v1<TAB>v2`
      lines (backlog and lag during the run): a growing backlog has a
      clearly positive slope.
"""
import json
import math
import sys
import urllib.request


class LogLinearHistogram:
    """HDR-style: each power of two split into 2**SUB_BITS linear buckets,
    so a recorded value is known to within 1/128 of itself (3 significant
    digits would be 1/1000; 1% is plenty for milliseconds)."""

    SUB_BITS = 7

    def __init__(self):
        self.counts = {}
        self.n = 0
        self.max = 0

    def bucket(self, v):
        # Values in microseconds, integers >= 0.
        if v < (1 << self.SUB_BITS):
            return (0, v)
        e = v.bit_length() - 1 - self.SUB_BITS
        return (e + 1, v >> e)

    def upper(self, key):
        e, sub = key
        return sub if e == 0 else ((sub + 1) << (e - 1)) - 1

    def record(self, v):
        v = max(0, int(v))
        k = self.bucket(v)
        self.counts[k] = self.counts.get(k, 0) + 1
        self.n += 1
        self.max = max(self.max, v)

    def percentile(self, q):
        """The highest value equivalent to the q-th percentile's bucket."""
        if not self.n:
            return float("nan")
        rank = max(1, math.ceil(q / 100 * self.n))
        seen = 0
        for k in sorted(self.counts):
            seen += self.counts[k]
            if seen >= rank:
                return min(self.upper(k), self.max)
        return self.max


def read_stamps(path, column=1):
    """event_id -> the column's integer (1: µs after the commit; 2: the
    consumer's Kafka timestamp in ms)."""
    stamps = {}
    with open(path) as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if len(parts) > column:
                # The first commit counts (a redelivery is not applied twice).
                stamps.setdefault(parts[0], int(parts[column]))
    return stamps


def summary(h):
    ms = lambda us: round(us / 1000, 2)
    return {
        "n": h.n,
        "p50": ms(h.percentile(50)),
        "p90": ms(h.percentile(90)),
        "p99": ms(h.percentile(99)),
        "p99.9": ms(h.percentile(99.9)),
        "max": ms(h.max),
    }


def join(api_path, applied_path, sent_path, out_path, label):
    api, applied, sent = read_stamps(api_path), read_stamps(applied_path), read_stamps(sent_path)
    produced = read_stamps(applied_path, 2)
    total, to_mark, from_mark = LogLinearHistogram(), LogLinearHistogram(), LogLinearHistogram()
    to_produce, from_produce = LogLinearHistogram(), LogLinearHistogram()
    with open(out_path, "w") as out:
        out.write(f"# label: {label}\n")
        for event_id, done in applied.items():
            started = api.get(event_id)
            if started is None:
                continue
            total.record(done - started)
            out.write(f"{(done - started) / 1000:.3f}\n")
            sent_at = produced.get(event_id)
            if sent_at is not None:
                to_produce.record(max(0, sent_at * 1000 - started))
                from_produce.record(max(0, done - sent_at * 1000))
            marked = sent.get(event_id)
            if marked is not None:
                to_mark.record(max(0, marked * 1000 - started))
                from_mark.record(max(0, done - marked * 1000))
    result = summary(total)
    result["api_stamped"] = len(api)
    result["applied_stamped"] = len(applied)
    result["api_commit_to_kafka_produce"] = summary(to_produce)
    result["kafka_produce_to_applied"] = summary(from_produce)
    result["api_commit_to_marked_sent"] = summary(to_mark)
    result["marked_sent_to_applied"] = summary(from_mark)
    print(json.dumps(result))


def scrape(url):
    try:
        text = urllib.request.urlopen(url, timeout=5).read().decode()
    except OSError as e:
        print(f"{url}: {e}", file=sys.stderr)
        text = ""
    out = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name_labels, _, value = line.rpartition(" ")
        name = name_labels.split("{")[0]
        stage = name_labels.split('stage="')[1].split('"')[0] if 'stage="' in name_labels else None
        for suffix in ("_bucket", "_sum", "_count"):
            if name.endswith(suffix):
                base = name[: -len(suffix)] + (f":{stage}" if stage else "")
                h = out.setdefault(base, {})
                if suffix == "_bucket":
                    le = name_labels.split('le="')[1].split('"')[0]
                    h[le] = h.get(le, 0) + float(value)
                else:
                    h[suffix[1:]] = h.get(suffix[1:], 0) + float(value)
    print(json.dumps(out))


def histo(before_path, after_path, name):
    before = json.load(open(before_path)).get(name, {})
    after = json.load(open(after_path)).get(name, {})
    if not after:
        print(json.dumps({"name": name, "count": 0}))
        return
    delta = {k: after[k] - before.get(k, 0) for k in after}
    n = delta.get("count", 0)
    bounds = sorted(((float(k), v) for k, v in delta.items() if k not in ("sum", "count")), key=lambda x: x[0])

    def q(p):
        for le, c in bounds:
            if c >= p * n:
                return le
        return float("inf")

    print(json.dumps({
        "name": name,
        "count": int(n),
        "mean_ms": round(1000 * delta.get("sum", 0) / n, 2) if n else None,
        "p50_le_ms": q(0.5) * 1000 if n else None,
        "p99_le_ms": q(0.99) * 1000 if n else None,
    }))


def slope(path):
    rows = [[float(x) for x in l.split()] for l in open(path) if l.strip()]
    if len(rows) < 2:
        print(json.dumps({"samples": len(rows)}))
        return
    t = [r[0] for r in rows]
    mt = sum(t) / len(t)
    out = {"samples": len(rows)}
    for col, name in ((1, "backlog"), (2, "lag")):
        v = [r[col] for r in rows]
        mv = sum(v) / len(v)
        var = sum((x - mt) ** 2 for x in t) or 1
        out[f"{name}_slope_per_s"] = round(sum((x - mt) * (y - mv) for x, y in zip(t, v)) / var, 2)
        out[f"{name}_max"] = max(v)
        out[f"{name}_last"] = v[-1]
    print(json.dumps(out))


def stages(before_path, after_path, prefix):
    """`histo` of every `prefix:stage` histogram."""
    after = json.load(open(after_path))
    for name in sorted(k for k in after if k.startswith(prefix + ":")):
        histo(before_path, after_path, name)


if __name__ == "__main__":
    command, args = sys.argv[1], sys.argv[2:]
    {"join": join, "scrape": scrape, "histo": histo, "stages": stages, "slope": slope}[command](*args)
