#!/usr/bin/env python3
"""The columns of ringzero-bench's table and CSV (bench/harness/table.hpp), against nccl-tests'
order: size count type redop root, then time algbw busbw #wrong out of place, the same four in
place, then ringzero's own (algorithm, median and %peak per placement). Each table cell must hold
the same value as the JSON row of the same run (time = the mean, busbw = algbw * the bus factor),
so a column out of place fails; the CSV header and cells must match too; the fields that
bench/gpu/device_check.sh reads from a table row (6: time, 8: busbw, 16: %peak) must be those.
Runs all_reduce (bus factor 2(n-1)/n), all_gather ((n-1)/n) and all_to_all (in place N/A) on 3 ranks.

usage: check_bench_table.py RINGZERO_BENCH DEVICE_CHECK_SH
"""
import csv
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from command_check import check, run, finish  # noqa: E402

TABLE_COLUMNS = ["size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw",
                 "#wrong", "algorithm", "median", "%peak", "median", "%peak"]
CSV_COLUMNS = ["size", "count", "type", "redop", "root", "oop_time_us", "oop_algbw_gbps", "oop_busbw_gbps", "oop_wrong",
               "ip_time_us", "ip_algbw_gbps", "ip_busbw_gbps", "ip_wrong", "algorithm", "oop_median_us", "oop_peak_percent",
               "ip_median_us", "ip_peak_percent", "collective", "ranks", "requested"]
BUS_FACTOR = {"all_reduce": 2 * 2 / 3, "all_gather": 2 / 3, "all_to_all": 2 / 3}  # nccl-tests, 3 ranks


def close(text, value, decimals):
    """Whether a table cell printed with `decimals` decimals shows `value`."""
    return abs(float(text) - value) <= 0.5 * 10 ** -decimals + 1e-9 * abs(value)


def check_row(coll, cells, row):
    """One table row (split at blanks) against its JSON row."""
    label = f"{coll} {row['size_bytes']} B"
    check(cells[0] == str(row["size_bytes"]), f"{label}: column 1 is not size ({cells[0]})")
    check(cells[1] == str(row["size_bytes"] // 4), f"{label}: column 2 is not count in elements ({cells[1]})")
    check(cells[2] == "float" and cells[3] == row["redop"] and cells[4] == str(row["root"]),
          f"{label}: columns 3-5 are not type, redop, root ({cells[2:5]})")
    for base, key in ((5, "out_of_place"), (9, "in_place")):
        p = row[key]
        if p is None:
            check(cells[base:base + 4] == ["N/A"] * 4, f"{label}: {key} is N/A but the cells read {cells[base:base + 4]}")
            continue
        check(close(cells[base], p["time_us"], 2), f"{label}: {key} time column {cells[base]} is not the mean {p['time_us']}")
        check(close(cells[base + 1], p["algbw_gbps"], 2), f"{label}: {key} algbw column {cells[base + 1]} != {p['algbw_gbps']}")
        check(close(cells[base + 2], p["busbw_gbps"], 2), f"{label}: {key} busbw column {cells[base + 2]} != {p['busbw_gbps']}")
        check(cells[base + 3] == str(p["wrong"]) == "0", f"{label}: {key} #wrong column {cells[base + 3]}, JSON {p['wrong']}")
        # time is the mean; algbw = size / time; busbw = algbw * nccl-tests' factor
        algbw = row["size_bytes"] / p["time_us"] / 1e3
        check(abs(p["algbw_gbps"] - algbw) <= 1e-6 * algbw, f"{label}: {key} algbw {p['algbw_gbps']} is not size / mean time {algbw}")
        check(abs(p["busbw_gbps"] - algbw * BUS_FACTOR[coll]) <= 1e-6 * algbw,
              f"{label}: {key} busbw {p['busbw_gbps']} is not algbw * {BUS_FACTOR[coll]:.4f}")
    check(cells[13] == row["algorithm"], f"{label}: column 14 is not the algorithm ({cells[13]} vs {row['algorithm']})")
    for base, key in ((14, "out_of_place"), (16, "in_place")):
        p = row[key]
        if p is None:
            check(cells[base:base + 2] == ["N/A", "N/A"], f"{label}: {key} median/%peak are not N/A")
            continue
        check(close(cells[base], p["median_us"], 2), f"{label}: {key} median column {cells[base]} != {p['median_us']}")
        check(cells[base + 1].endswith("%") and close(cells[base + 1][:-1], 100 * p["peak_fraction"], 1),
              f"{label}: {key} %peak column {cells[base + 1]} != {100 * p['peak_fraction']}")


def check_device_check_parser(device_check, line, row):
    """Runs the awk program with which bench/gpu/device_check.sh reads a table row on `line`: it
    must print that row's out-of-place mean time, busbw and %peak."""
    with open(device_check, encoding="utf-8") as f:
        text = f.read()
    m = re.search(r"grep -m1 -E \"\^ \+268435456 \" \| awk '([^']*)'", text)
    if not check(m is not None, "device_check.sh: no awk program reading the 256 MiB row found"):
        return
    p = subprocess.run(["awk", m.group(1)], input=line + "\n", capture_output=True, text=True)
    got = re.fullmatch(r"256 MiB: (\S+) us, busbw (\S+) GB/s, %peak (\S+)%", p.stdout.strip())
    oop = row["out_of_place"]
    check(got is not None and close(got.group(1), oop["time_us"], 2) and close(got.group(2), oop["busbw_gbps"], 2) and
          close(got.group(3), 100 * oop["peak_fraction"], 1),
          f"device_check.sh's awk reads {p.stdout.strip()!r} from a row whose time, busbw, %peak are "
          f"{oop['time_us']}, {oop['busbw_gbps']}, {100 * oop['peak_fraction']}")


def check_csv(coll, path, rows):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    lines = text.splitlines()
    check(lines and lines[0].split(",") == CSV_COLUMNS, f"{coll}: CSV header {lines[0] if lines else None!r}")
    records = list(csv.DictReader(lines))
    check(len(records) == len(rows), f"{coll}: {len(records)} CSV rows, {len(rows)} JSON rows")
    for rec, row in zip(records, rows):
        label = f"{coll} CSV {row['size_bytes']} B"
        check(int(rec["size"]) == row["size_bytes"] and rec["collective"] == coll and rec["ranks"] == "3",
              f"{label}: size/collective/ranks {rec['size']} {rec['collective']} {rec['ranks']}")
        check(rec["algorithm"] == row["algorithm"], f"{label}: algorithm {rec['algorithm']}")
        for prefix, key in (("oop_", "out_of_place"), ("ip_", "in_place")):
            p = row[key]
            if p is None:
                check(all(rec[prefix + c] == "" for c in ("time_us", "algbw_gbps", "busbw_gbps", "wrong", "median_us", "peak_percent")),
                      f"{label}: {key} N/A cells are not empty")
                continue
            for column, value in (("time_us", p["time_us"]), ("busbw_gbps", p["busbw_gbps"]), ("median_us", p["median_us"]),
                                  ("peak_percent", 100 * p["peak_fraction"])):
                check(abs(float(rec[prefix + column]) - value) <= 1e-4 * abs(value) + 1e-9,
                      f"{label}: CSV {prefix + column} {rec[prefix + column]} != JSON {value}")
            check(rec[prefix + "wrong"] == "0", f"{label}: CSV {prefix}wrong {rec[prefix + 'wrong']}")


def main() -> int:
    bench = sys.argv[1]
    with tempfile.TemporaryDirectory() as d:
        for coll in ("all_reduce", "all_gather", "all_to_all"):
            jpath, cpath = os.path.join(d, coll + ".json"), os.path.join(d, coll + ".csv")
            p = run(bench, coll, "-b", "4K", "-e", "64K", "-f", "4", "-n", "5", "-w", "1", "--ranks", "3",
                    "--bandwidth-bytes", "64K", "--json", jpath, "--csv", cpath)
            if not check(p.returncode == 0, f"{coll}: exit status {p.returncode}"):
                continue
            lines = p.stdout.splitlines()
            header = [ln for ln in lines if ln.startswith("#") and "#wrong" in ln]
            check(len(header) == 1 and header[0][1:].split() == TABLE_COLUMNS,
                  f"{coll}: table header {header!r}, expected the columns {TABLE_COLUMNS}")
            groups = [ln for ln in lines if ln.startswith("#") and "out-of-place" in ln]
            check(len(groups) == 1 and groups[0].split()[1:] == ["out-of-place", "in-place", "out-of-place", "in-place"],
                  f"{coll}: placement line {groups!r}")
            if groups and header:  # "out-of-place" starts above the first time column
                check(groups[0].index("out-of-place") == header[0].index("      time") + 1,
                      f"{coll}: 'out-of-place' is not above the first time column")
            table_lines = [ln for ln in lines if ln and not ln.startswith("#")]
            table = [ln.split() for ln in table_lines]
            with open(jpath, encoding="utf-8") as f:
                rows = json.load(f)["rows"]
            check(len(table) == len(rows) == 3, f"{coll}: {len(table)} table rows, {len(rows)} JSON rows, expected 3")
            for cells, row in zip(table, rows):
                check(len(cells) == len(TABLE_COLUMNS), f"{coll}: a row has {len(cells)} cells: {cells}")
                if len(cells) == len(TABLE_COLUMNS):
                    check_row(coll, cells, row)
            if table_lines and rows:
                check_device_check_parser(sys.argv[2], table_lines[-1], rows[-1])
            check_csv(coll, cpath, rows)
        # --csv is checked before measuring, as --json.
        p = run(bench, "all_reduce", "-b", "1K", "-e", "1K", "-n", "1", "-w", "0", "--ranks", "2", "--bandwidth-bytes", "64K",
                "--csv", os.path.join(d, "no-such-dir", "x.csv"))
        check(p.returncode == 105 and "--csv" in p.stderr, f"--csv in a missing directory: exit status {p.returncode}")
    return finish()


if __name__ == "__main__":
    sys.exit(main())
