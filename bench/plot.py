#!/usr/bin/env python3
"""Draws bus bandwidth against size for several benchmark result files on one chart.

    bench/plot.py ring.json direct.csv --label ring --label direct -o busbw.png

Reads the result files of ringzero-bench and ringzero-mpi-compare (--json or --csv, the columns of
bench/harness/table.hpp) and the all_reduce rows of ringzero-gpu-bench --json. One line per file
(legend: --label, one per file in order, else the file's name without its extension); a file
whose rows differ in type, redop, root or ranks gets one line per combination, and --split
FIELD (e.g. requested, for ringzero-mpi-compare's four algorithms) splits on that field too.
x: size in bytes on a log2 axis; y: busbw in GB/s of --placement (out_of_place by default; the
other placement when a file measured only that one). Needs matplotlib (Debian: python3-matplotlib).
Exit status 2 on a file it cannot read or that holds no row.
"""

import argparse
import csv
import json
import os
import sys

PLACEMENTS = ("out_of_place", "in_place")
CSV_PREFIX = {"out_of_place": "oop_", "in_place": "ip_"}
KEY_FIELDS = ("type", "redop", "root", "ranks")


def fail(message):
    print(f"plot.py: {message}", file=sys.stderr)
    sys.exit(2)


def rows_from_json(path, doc):
    """The harness rows of a JSON result file (ringzero-bench, -mpi-compare, -gpu-bench)."""
    rows = doc.get("rows")
    if "all_reduce" in doc and isinstance(doc["all_reduce"], list):
        rows = doc["all_reduce"]  # ringzero-gpu-bench: its "rows" are the primitives
    if not isinstance(rows, list):
        fail(f"{path}: no rows with size_bytes (not a result file of ringzero-bench, -mpi-compare or -gpu-bench)")
    out = []
    for r in rows:
        if not isinstance(r, dict) or "size_bytes" not in r:
            fail(f"{path}: a row without size_bytes (not a result file of ringzero-bench, -mpi-compare or -gpu-bench)")
        row = {k: r.get(k) for k in ("size_bytes", "type", "redop", "root", "ranks", "algorithm", "requested",
                                     "collective")}
        for p in PLACEMENTS:
            cell = r.get(p)
            row[p] = None if cell is None else cell.get("busbw_gbps")
        out.append(row)
    return out


def rows_from_csv(path, text):
    """The rows of a CSV result file (bench/harness/table.hpp's csv_header)."""
    reader = csv.DictReader(text.splitlines())
    if not reader.fieldnames or "size" not in reader.fieldnames or "oop_busbw_gbps" not in reader.fieldnames:
        fail(f"{path}: not a benchmark CSV file (its header lacks size and oop_busbw_gbps)")
    out = []
    for r in reader:
        row = {"size_bytes": int(r["size"]), "type": r["type"], "redop": r["redop"], "root": r["root"],
               "ranks": r.get("ranks"), "algorithm": r.get("algorithm"), "requested": r.get("requested"),
               "collective": r.get("collective")}
        for p in PLACEMENTS:
            value = r.get(CSV_PREFIX[p] + "busbw_gbps", "")
            row[p] = float(value) if value not in ("", None) else None
        out.append(row)
    return out


def read_rows(path):
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        fail(f"cannot read {path}: {e.strerror}")
    if text.lstrip().startswith("{"):
        try:
            rows = rows_from_json(path, json.loads(text))
        except json.JSONDecodeError as e:
            fail(f"{path}: not valid JSON ({e})")
    else:
        rows = rows_from_csv(path, text)
    if not rows:
        fail(f"{path}: no rows")
    return rows


def series_of(label, rows, placement, split):
    """{series label: [(size, busbw)]} for one file's rows."""
    measured = [p for p in PLACEMENTS if any(r[p] is not None for r in rows)]
    if not measured:
        return {}
    use = placement if placement in measured else measured[0]
    varying = [k for k in KEY_FIELDS if len({str(r.get(k)) for r in rows}) > 1]
    if split and split not in varying and len({str(r.get(split)) for r in rows}) > 1:
        varying.append(split)
    series = {}
    for r in rows:
        if r[use] is None:
            continue
        parts = [f"{r.get(k)}" if k in ("type", "redop", "requested", "algorithm", "collective") else f"{k} {r.get(k)}"
                 for k in varying]
        name = label + (f" ({', '.join(parts)})" if parts else "")
        series.setdefault(name, []).append((r["size_bytes"], r[use]))
    return series


def size_text(b):
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if b >= scale and b % scale == 0:
            return f"{b // scale}{unit}"
    return str(b)


def main(argv=None):
    ap = argparse.ArgumentParser(description="busbw against size for benchmark result files (JSON or CSV), one chart")
    ap.add_argument("files", nargs="+",
                    help="result files of ringzero-bench / -mpi-compare (--json, --csv) or -gpu-bench (--json)")
    ap.add_argument("--label", action="append", default=[],
                    help="legend entry of the next file (repeat, in file order)")
    ap.add_argument("--placement", choices=PLACEMENTS, default="out_of_place",
                    help="which placement's busbw (default out_of_place)")
    ap.add_argument("--split", help="a row field that splits a file into several lines (e.g. requested, algorithm)")
    ap.add_argument("--title", default=None, help="the chart's title")
    ap.add_argument("-o", "--output", required=True, help="the image to write (PNG, SVG or PDF, by its extension)")
    a = ap.parse_args(argv)
    if len(a.label) > len(a.files):
        fail(f"{len(a.label)} --label for {len(a.files)} file(s)")

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        fail(f"matplotlib is missing for {sys.executable} (Debian: apt-get install python3-matplotlib; "
             "scripts/install_deps.sh installs it)")

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    sizes = set()
    lines = 0
    for i, path in enumerate(a.files):
        label = a.label[i] if i < len(a.label) else os.path.splitext(os.path.basename(path))[0]
        for name, points in series_of(label, read_rows(path), a.placement, a.split).items():
            points.sort()
            sizes.update(p[0] for p in points)
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", markersize=3, label=name)
            lines += 1
    if lines == 0:
        fail("no row with a measured busbw in " + ", ".join(a.files))
    ax.set_xscale("log", base=2)
    ticks = sorted(sizes)
    if len(ticks) > 12:
        ticks = ticks[:: (len(ticks) + 11) // 12]
    ax.set_xticks(ticks)
    ax.set_xticklabels([size_text(t) for t in ticks], rotation=45)
    ax.set_xlabel("size (bytes)")
    ax.set_ylabel(f"busbw (GB/s), {a.placement.replace('_', ' ')}")
    if a.title:
        ax.set_title(a.title)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    try:
        fig.savefig(a.output)
    except OSError as e:
        fail(f"cannot write {a.output}: {e.strerror}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
