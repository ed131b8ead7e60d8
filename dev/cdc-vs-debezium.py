"""The reader and judge of dev/cdc-vs-debezium.sh: every column of every row state, as MariaDB
says it, as `orderpipe cdc` published it (JSON and Avro value formats) and as Debezium's MariaDB
connector published it (JSON converter, schemas on), side by side.

    python3 dev/cdc-vs-debezium.py WORK REGISTRY_URL [check]

WORK holds what the shell script gathered:
  columns.tsv   information_schema.COLUMNS of the database (table, column, data type, column
                type, charset, key), the types that decide how each value is read;
  timeline.txt  the fixture's DML run one statement at a time, each followed by every table's rows
                as MariaDB renders them (`snap N VERB`, then `row TABLE JSON_OBJECT(...)` lines):
                the oracle. A change of a key between two snapshots is one row state: `before`
                (the rows it left), `after` (the row it became);
  dump.jsonl    every record of the change topics (dev/debezium/TopicDump.java, read_committed);
  topics.tsv    which topic is whose (`op-json`, `op-avro`, `dbz`) and of which table.

Each source's records are flattened into row images (an insert its row, an update its before and
after, a delete the row deleted; Debezium's key change is a delete and a create, the same two
images) and each image is matched to the oracle's state of the same key, in order. Values are
compared after decoding each form to one value per type family (an integer, a Decimal, the float's
bits, a date-time string, microseconds of a TIME, bytes, parsed JSON): a different form is not a
difference; a different value is. Prints the table, then a summary per column type, and writes
comparison.tsv into WORK. Exit 0 when every image of every source was found, else 1; with
`check`, only that: 0, or 3 while a state is missing (the shell script's wait for the records).
"""

import base64
import json
import struct
import sys
import unicodedata
import urllib.request
from collections import defaultdict
from decimal import Decimal, getcontext

WORK, REGISTRY = sys.argv[1], sys.argv[2]
CHECK = sys.argv[3:] == ["check"]
getcontext().prec = 100  # DECIMAL(65,30) and Debezium's unscaled integers, exactly

# ---- the database's columns -------------------------------------------------------------------
COLUMNS = defaultdict(list)  # table -> [(column, data_type, column_type, charset)]
KEYS = defaultdict(list)  # table -> key columns
for line in open(f"{WORK}/columns.tsv"):
    table, col, dtype, ctype, charset, key = line.rstrip("\n").split("\t")
    COLUMNS[table].append((col, dtype.lower(), ctype, "" if charset == "NULL" else charset))
    if key == "PRI":
        KEYS[table].append(col)

INTS = {"tinyint", "smallint", "mediumint", "int", "bigint", "year", "bit"}
BYTES = {"binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob"}
# Spatial values as MariaDB stores them (a 4-byte SRID, then WKB), compared as bytes.
BYTES |= {"geometry", "point", "linestring", "polygon", "multipoint", "multilinestring", "multipolygon",
          "geometrycollection"}
DATETIMES = {"datetime", "timestamp"}


def family(dtype):
    if dtype in INTS:
        return "int"
    if dtype in BYTES:
        return "bytes"
    if dtype in ("decimal", "float", "double", "date", "time", "json"):
        return dtype
    if dtype in DATETIMES:
        return "datetime"
    return "str"


# ---- calendar arithmetic over the whole proleptic range (Python's datetime stops at year 1) -----
def days_from_civil(y, m, d):
    y -= m <= 2
    era = (y if y >= 0 else y - 399) // 400
    yoe = y - era * 400
    doy = (153 * (m + (-3 if m > 2 else 9)) + 2) // 5 + d - 1
    return era * 146097 + yoe * 365 + yoe // 4 - yoe // 100 + doy - 719468


def civil_from_days(z):
    z += 719468
    era = (z if z >= 0 else z - 146096) // 146097
    doe = z - era * 146097
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    d = doy - (153 * mp + 2) // 5 + 1
    m = mp + (3 if mp < 10 else -9)
    return yoe + era * 400 + (m <= 2), m, d


def dt_from_micros(us):
    days, rem = divmod(us, 86_400_000_000)
    y, m, d = civil_from_days(days)
    s, frac = divmod(rem, 1_000_000)
    return f"{y:04d}-{m:02d}-{d:02d} {s // 3600:02d}:{s // 60 % 60:02d}:{s % 60:02d}.{frac:06d}"


def norm_dt(s):
    """`YYYY-MM-DD[T ]HH:MM:SS[.f][Z|+00:00]` -> `YYYY-MM-DD HH:MM:SS.ffffff` (zones: UTC only)."""
    s = s.replace("T", " ")
    for utc in ("Z", "+00:00"):
        s = s.removesuffix(utc)
    date, _, rest = s.partition(" ")
    clock, _, frac = (rest or "00:00:00").partition(".")
    return f"{date} {clock}.{frac.ljust(6, '0')[:6]}"


def time_micros(s):
    neg = s.startswith("-")
    h, m, sec = s.lstrip("-").split(":")
    whole, _, frac = sec.partition(".")
    us = ((int(h) * 60 + int(m)) * 60 + int(whole)) * 1_000_000 + int(frac.ljust(6, "0")[:6] or 0)
    return -us if neg else us


def bits(x, dtype):
    return struct.pack("<f" if dtype == "float" else "<d", float(x))


class Unreadable(str):
    """A value that is not of its column's type in any form (never equal to a readable one)."""


def readable(canon):
    """canon, but a value it cannot read is Unreadable (a difference) rather than an error."""

    def read(v, *rest):
        try:
            return canon(v, *rest)
        except (ValueError, TypeError, ArithmeticError, json.JSONDecodeError, AttributeError):
            return Unreadable(repr(v))

    return read


@readable
def canon_text(v, dtype):
    """A value as MariaDB or orderpipe gives it (text or a JSON scalar) -> the family's value."""
    if v is None:
        return None
    fam = family(dtype)
    if isinstance(v, bytes):  # an Avro bytes field: the bytes, or a big-endian two's-complement integer
        return v if fam == "bytes" else int.from_bytes(v, "big", signed=True) if fam == "int" else v.decode()
    if fam == "int":
        if isinstance(v, bool):
            return int(v)
        if isinstance(v, str) and v.startswith("0x"):
            return int(v[2:] or "0", 16)
        if isinstance(v, str) and v.startswith("b'"):
            return int(v[2:-1] or "0", 2)
        return int(v)
    if fam == "decimal":
        return Decimal(str(v))
    if fam in ("float", "double"):
        return bits(v, dtype)
    if fam == "datetime":
        return norm_dt(str(v))
    if fam == "time":
        return time_micros(str(v))
    if fam == "bytes":
        if isinstance(v, str) and v.startswith("0x"):
            return bytes.fromhex(v[2:])
        return str(v).encode()
    if fam == "json":
        return json.loads(v, parse_float=Decimal) if isinstance(v, str) else v
    return v if isinstance(v, str) else json.dumps(v)


@readable
def canon_dbz(v, field, dtype):
    """A Debezium value and its Connect field schema -> the family's value."""
    if v is None:
        return None
    name, params = field.get("name", ""), field.get("parameters", {})
    if name == "org.apache.kafka.connect.data.Decimal":
        raw = int.from_bytes(base64.b64decode(v), "big", signed=True)
        return Decimal(raw).scaleb(-int(params.get("scale", 0)))
    if name == "io.debezium.data.Bits":
        return int.from_bytes(base64.b64decode(v), "little")
    if name.startswith("io.debezium.data.geometry."):  # {wkb, srid}: MariaDB's SRID then WKB
        return struct.pack("<I", v.get("srid") or 0) + base64.b64decode(v["wkb"])
    if name == "io.debezium.time.Date":
        y, m, d = civil_from_days(int(v))
        return f"{y:04d}-{m:02d}-{d:02d}"
    if name == "io.debezium.time.Timestamp":
        return dt_from_micros(int(v) * 1000)
    if name == "io.debezium.time.MicroTimestamp":
        return dt_from_micros(int(v))
    if name == "io.debezium.time.NanoTimestamp":
        return dt_from_micros(int(v) // 1000)
    if name == "io.debezium.time.MicroTime":
        return int(v)
    if name == "io.debezium.time.Time":
        return int(v) * 1000
    if field.get("type") == "bytes":
        b = base64.b64decode(v)
        return b if family(dtype) == "bytes" else canon_text(b.decode("utf-8", "replace"), dtype)
    return canon_text(v, dtype)


# ---- Avro (orderpipe's frames): a generic binary decoder over the writer's schema ---------------
SCHEMAS = {}


def registry_schema(sid):
    if sid not in SCHEMAS:
        with urllib.request.urlopen(f"{REGISTRY}/schemas/ids/{sid}") as r:
            SCHEMAS[sid] = json.loads(json.load(r)["schema"])
    return SCHEMAS[sid]


class Avro:
    def __init__(self, buf):
        self.b, self.i, self.named = buf, 0, {}

    def long(self):
        shift = acc = 0
        while True:
            byte = self.b[self.i]
            self.i += 1
            acc |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                return (acc >> 1) ^ -(acc & 1)

    def take(self, n):
        self.i += n
        return self.b[self.i - n : self.i]

    def read(self, s):
        if isinstance(s, list):
            return self.read(s[self.long()])
        if isinstance(s, str):
            s = self.named.get(s, {"type": s})
        t = s["type"]
        if isinstance(t, (list, dict)):
            return self.read(t)
        if "name" in s and t in ("record", "enum", "fixed"):
            self.named[s["name"]] = s
            if "namespace" in s:
                self.named[f"{s['namespace']}.{s['name']}"] = s
        if t == "null":
            return None
        if t == "boolean":
            return self.take(1) != b"\0"
        if t in ("int", "long"):
            return self.long()
        if t == "float":
            return struct.unpack("<f", self.take(4))[0]
        if t == "double":
            return struct.unpack("<d", self.take(8))[0]
        if t == "bytes":
            return self.take(self.long())
        if t == "string":
            return self.take(self.long()).decode()
        if t == "fixed":
            return self.take(s["size"])
        if t == "enum":
            return s["symbols"][self.long()]
        if t == "record":
            return {f["name"]: self.read(f["type"]) for f in s["fields"]}
        if t in ("array", "map"):
            out = [] if t == "array" else {}
            while (n := self.long()) != 0:
                if n < 0:
                    n = -n
                    self.long()
                for _ in range(n):
                    if t == "array":
                        out.append(self.read(s["items"]))
                    else:
                        k = self.take(self.long()).decode()
                        out[k] = self.read(s["values"])
            return out
        raise ValueError(f"Avro type {t} not read")


def orderpipe_images(value):
    """An orderpipe record -> [(role, change, {column: value})]."""
    sid = int.from_bytes(value[1:5], "big")
    e = Avro(value[5:]).read(registry_schema(sid))
    data, old = e["data"], e["old"]
    if isinstance(data, str):  # the JSON value format: data and old are JSON text
        data = json.loads(data, parse_float=Decimal)
        old = json.loads(old, parse_float=Decimal) if old else None
    elif old is not None:  # typed: old holds the changed columns, named by `changed`
        old = {c: old[c] for c in e.get("changed") or []}
    change = e["change"]
    if change == "insert":
        return [("after", change, data)]
    if change == "delete":
        return [("before", change, data)]
    return [("before", change, {**data, **(old or {})}), ("after", change, data)]


def debezium_images(value):
    """A Debezium record (JSON, schemas on) -> [(role, op, {column: (value, field schema)})]."""
    v = json.loads(value, parse_float=Decimal)
    fields = {f["field"]: f for f in v["schema"]["fields"]}
    p = v["payload"]
    out = []
    for role in ("before", "after"):
        if p.get(role) is not None:
            schema = {f["field"]: f for f in fields[role]["fields"]}
            out.append((role, p["op"], {c: (x, schema[c]) for c, x in p[role].items()}))
    return out


# ---- the oracle: MariaDB's rows after every statement -----------------------------------------
def read_timeline():
    """-> {(table, key): [("before"|"after", verb, row)]} in order, and the states' order. The first
    snapshot is the state before the fixture's DML; each later one follows the statement VERB."""
    states, order = defaultdict(list), []
    prev, cur, verb = None, None, None

    def diff():
        for table in COLUMNS:
            a, b = prev.get(table, {}), cur.get(table, {})
            for key in sorted(set(a) | set(b), key=str):
                if a.get(key) == b.get(key):
                    continue
                for role, row in (("before", a.get(key)), ("after", b.get(key))):
                    if row is not None:
                        states[(table, key)].append((role, verb, row))
                        order.append((table, key, role, len(states[(table, key)]) - 1))

    for line in open(f"{WORK}/timeline.txt", encoding="utf-8"):
        line = line.rstrip("\n")
        if line.startswith("snap\t"):
            if cur is not None and prev is not None:
                diff()
            if cur is not None:
                prev = cur
            cur, verb = {}, line.split("\t")[2]
        elif line.startswith("row\t"):
            _, table, obj = line.split("\t", 2)
            row = json.loads(obj)
            cur.setdefault(table, {})[db_key(table, row)] = row
    if cur is not None and prev is not None:
        diff()
    return states, order


def db_key(table, row, canon=lambda v, c: canon_text(v, c)):
    types = {c: d for c, d, _, _ in COLUMNS[table]}
    return tuple(str(canon(row[k], types[k])) for k in KEYS[table])


def show(v):
    """A value as JSON text, with invisible characters (controls, U+0081, ...) escaped."""
    text = json.dumps(v, default=str, ensure_ascii=False)
    return "".join(f"\\u{ord(ch):04x}" if unicodedata.category(ch) in ("Cc", "Cf") else ch for ch in text)


def main():
    states, order = read_timeline()
    topics = {}
    for line in open(f"{WORK}/topics.tsv"):
        who, table, topic = line.rstrip("\n").split("\t")
        topics[topic] = (who, table)
    records = defaultdict(list)
    for line in open(f"{WORK}/dump.jsonl"):
        r = json.loads(line)
        if r["value"] is not None and r["topic"] in topics:
            records[r["topic"]].append(r)
    # source -> {(table, key, role, n): (change, {column: canonical}, {column: raw})}
    found = defaultdict(dict)
    unmatched = defaultdict(int)
    for topic, recs in records.items():
        who, table = topics[topic]
        types = {c: d for c, d, _, _ in COLUMNS[table]}
        seen = defaultdict(lambda: {"before": 0, "after": 0})
        for r in sorted(recs, key=lambda r: (r["partition"], r["offset"])):
            raw = base64.b64decode(r["value"])
            if who == "dbz":
                images = [
                    (role, op, {c: canon_dbz(x, f, types.get(c, "")) for c, (x, f) in row.items()},
                     {c: x for c, (x, f) in row.items()})
                    for role, op, row in debezium_images(raw)
                ]
            else:
                images = [
                    (role, ch, {c: canon_text(x, types.get(c, "")) for c, x in row.items()}, row)
                    for role, ch, row in orderpipe_images(raw)
                ]
            for role, change, canon, rawrow in images:
                key = tuple(str(canon.get(k)) for k in KEYS[table])
                # The n-th image of this role and key is the oracle's n-th state of it with that role.
                cands = [i for i, (rl, _, _) in enumerate(states.get((table, key), [])) if rl == role]
                n = seen[key][role]
                seen[key][role] += 1
                if n < len(cands):
                    found[who][(table, key, role, cands[n])] = (change, canon, rawrow)
                else:
                    unmatched[who] += 1
    sources = [w for w in ("op-json", "op-avro", "dbz") if any(w == t[0] for t in topics.values())]
    # A source without a topic of a table (Debezium left a table out) is not waited for there.
    captured = {(who, table) for who, table in topics.values()}
    if CHECK:
        stopped = set(open(f"{WORK}/stopped.txt").read().split())
        waited = [w for w in sources if w not in stopped]
        complete = all(
            (who, st[0]) not in captured or st in found[who] for st in order for who in waited
        ) and not any(unmatched[w] for w in waited)
        sys.exit(0 if complete else 3)
    rows, summary = [], defaultdict(lambda: defaultdict(int))
    examples = defaultdict(dict)
    missing = defaultdict(int)
    for table, key, role, n in order:
        _, verb, dbrow = states[(table, key)][n]
        state = {"INSERT": "insert", "DELETE": "delete"}.get(verb, f"{verb.lower()} {role}")
        for col, dtype, ctype, charset in COLUMNS[table]:
            want = canon_text(dbrow.get(col), dtype)
            typ = f"{ctype} {charset}".strip()
            cells, verdicts = [], []
            for who in sources:
                got = found[who].get((table, key, role, n))
                if (who, table) not in captured:
                    cells.append("(not captured)")
                    verdicts.append(f"{who} not captured")
                    summary[typ][f"{who} not captured"] += 1
                    continue
                if got is None:
                    missing[who] += col == COLUMNS[table][0][0]
                    cells.append("(missing)")
                    verdicts.append(f"{who} missing")
                    summary[typ][f"{who} missing"] += 1
                    continue
                cells.append(show(got[2].get(col)))
                same = col in got[1] and got[1][col] == want
                summary[typ][f"{who} {'same' if same else 'diff'}"] += 1
                if not same:
                    verdicts.append(f"{who}≠db")
                    examples[typ].setdefault(who, (dbrow.get(col), cells[-1], state))
            rows.append([table, col, typ, state, show(dbrow.get(col)), *cells,
                         "same" if not verdicts else ", ".join(verdicts)])
    header = ["table", "column", "type", "state", "MariaDB", *sources, "verdict"]
    with open(f"{WORK}/comparison.tsv", "w") as out:
        for r in [header, *rows]:
            out.write("\t".join(c.replace("\t", " ").replace("\n", " ") for c in r) + "\n")
    cut = lambda s: s if len(s) <= 34 else s[:31] + "..."
    widths = [max(len(cut(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, *rows]:
        print("  ".join(cut(c).ljust(w) for c, w in zip(r, widths)).rstrip())
    print("\n== per column type: cells the same as MariaDB / different (first difference: MariaDB | source)")
    for typ, counts in summary.items():
        line = "  ".join(f"{k} {v}" for k, v in sorted(counts.items()))
        print(f"{cut(typ)}: {line}")
        for who, (db, got, state) in examples[typ].items():
            print(f"    {who} ({state}): MariaDB {show(db)} | {got}")
    why = {(w, t): r for w, t, r in (l.rstrip("\n").split("\t", 2) for l in open(f"{WORK}/left-out.tsv") if l.strip())}
    for who in sources:
        total = sum((who, st[0]) in captured for st in order)
        print(f"{who}: {total - missing[who]} of {total} row states of the tables it captured found, "
              f"{unmatched[who]} images matched no state")
        for t in sorted(t for t in COLUMNS if (who, t) not in captured):
            print(f"    left out: {t}: {why.get((who, t), '?')}")
    sys.exit(0 if all(missing[w] == 0 and unmatched[w] == 0 for w in sources) else 1)


if __name__ == "__main__":
    main()
