"""Merge benchmark JSON lines into a committed results file:
    python3 tools/merge_results.py bench/results/h200/softmax.jsonl new.jsonl [--op OP ...]

A new row replaces the committed row of the same (op, impl, shape, dtype); other rows stay, so a
file holds the latest measurement of every row (each row carries its commit and date). --op keeps
only rows of the named ops from the new files (one run's output can feed several files).
"""
import argparse
import json


def key(row):
    return (row["op"], row["impl"], row["shape"], row["dtype"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("target")
    ap.add_argument("new", nargs="+")
    ap.add_argument("--op", action="append")
    a = ap.parse_args()
    rows = {}
    try:
        with open(a.target) as f:
            for line in f:
                if line.strip():
                    r = json.loads(line)
                    rows[key(r)] = r
    except FileNotFoundError:
        pass
    n = 0
    for path in a.new:
        with open(path) as f:
            for line in f:
                if not line.strip():
                    continue
                r = json.loads(line)
                if a.op and r["op"] not in a.op:
                    continue
                rows[key(r)] = r
                n += 1
    with open(a.target, "w") as f:
        for r in sorted(rows.values(), key=key):
            f.write(json.dumps(r) + "\n")
    print("%s: %d rows (%d merged)" % (a.target, len(rows), n))


if __name__ == "__main__":
    main()
