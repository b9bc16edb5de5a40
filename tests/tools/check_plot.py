#!/usr/bin/env python3
"""bench/plot.py on tiny result files: a ringzero-bench --json and --csv pair written here by the
program itself, a hand-made ringzero-mpi-compare CSV split by the requested algorithm, and a
ringzero-gpu-bench JSON. The chart must be a PNG of the figure's size, plot.py's series must be
the rows' busbw against size (one line per file, or per requested algorithm with --split), and a
file with no rows, an unreadable file or more --label than files must exit 2 with a message.
Needs matplotlib (scripts/install_deps.sh installs python3-matplotlib); this test fails without it.

usage: check_plot.py PLOT_PY RINGZERO_BENCH
"""
import importlib.util
import os
import struct
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from command_check import check, run, finish  # noqa: E402

MPI_CSV = """size,count,type,redop,root,oop_time_us,oop_algbw_gbps,oop_busbw_gbps,oop_wrong,ip_time_us,ip_algbw_gbps,ip_busbw_gbps,ip_wrong,algorithm,oop_median_us,oop_peak_percent,ip_median_us,ip_peak_percent,collective,ranks,requested
65536,16384,float,sum,-1,20,3.2768,3.2768,0,,,,,ring,19,,,,all_reduce,2,ring
65536,16384,float,sum,-1,40,1.6384,1.6384,0,,,,,native,39,,,,all_reduce,2,native
262144,65536,float,sum,-1,40,6.5536,6.5536,0,,,,,ring,39,,,,all_reduce,2,ring
262144,65536,float,sum,-1,80,3.2768,3.2768,0,,,,,native,79,,,,all_reduce,2,native
"""

GPU_JSON = """{"program": "ringzero-gpu-bench", "rows": [{"operation": "copy", "gbps": 1}],
 "all_reduce": [{"collective": "all_reduce", "size_bytes": 1048576, "count": 262144, "type": "float32", "redop": "sum",
   "root": -1, "algorithm": "ring", "ranks": 2, "out_of_place": {"time_us": 10, "median_us": 10, "algbw_gbps": 104.8576,
   "busbw_gbps": 104.8576, "peak_fraction": 0.5, "wrong": 0}, "in_place": null}]}
"""


def png_size(path):
    """(width, height) of a PNG file, or None when it is not one."""
    with open(path, "rb") as f:
        head = f.read(24)
    if len(head) < 24 or head[:8] != b"\x89PNG\r\n\x1a\n" or head[12:16] != b"IHDR":
        return None
    return struct.unpack(">II", head[16:24])


def main() -> int:
    plot, bench = sys.argv[1], sys.argv[2]
    if not check(importlib.util.find_spec("matplotlib") is not None,
                 f"matplotlib is missing for {sys.executable} (scripts/install_deps.sh installs python3-matplotlib)"):
        return finish()
    sys.path.insert(0, os.path.dirname(os.path.abspath(plot)))
    import plot as plot_module  # the series plot.py draws, checked below
    py = sys.executable
    with tempfile.TemporaryDirectory() as d:
        jpath, cpath = os.path.join(d, "local.json"), os.path.join(d, "local.csv")
        p = run(bench, "all_reduce", "-b", "4K", "-e", "64K", "-f", "4", "-n", "3", "-w", "1", "--ranks", "2",
                "--bandwidth-bytes", "64K", "--json", jpath, "--csv", cpath)
        check(p.returncode == 0, f"ringzero-bench: exit status {p.returncode}")
        mpi = os.path.join(d, "mpi.csv")
        gpu = os.path.join(d, "gpu.json")
        with open(mpi, "w", encoding="utf-8") as f:
            f.write(MPI_CSV)
        with open(gpu, "w", encoding="utf-8") as f:
            f.write(GPU_JSON)

        # The series: JSON and CSV of the same run give the same points (to the CSV's 6 digits).
        from_json = plot_module.series_of("json", plot_module.read_rows(jpath), "out_of_place", None)
        from_csv = plot_module.series_of("csv", plot_module.read_rows(cpath), "out_of_place", None)
        check(list(from_json) == ["json"] and list(from_csv) == ["csv"], f"series names {list(from_json)} {list(from_csv)}")
        if from_json and from_csv:
            a, b = from_json["json"], from_csv["csv"]
            check([s for s, _ in a] == [4096, 16384, 65536] and [s for s, _ in b] == [4096, 16384, 65536],
                  f"sizes {a} {b}")
            check(all(abs(x[1] - y[1]) <= 1e-5 * x[1] for x, y in zip(a, b)), f"busbw from JSON {a} and CSV {b} differ")
        split = plot_module.series_of("mpi", plot_module.read_rows(mpi), "out_of_place", "requested")
        check(split == {"mpi (ring)": [(65536, 3.2768), (262144, 6.5536)], "mpi (native)": [(65536, 1.6384), (262144, 3.2768)]},
              f"--split requested: {split}")
        # in_place asked, but the file measured only out of place: the measured placement is drawn
        check(plot_module.series_of("g", plot_module.read_rows(gpu), "in_place", None) == {"g": [(1048576, 104.8576)]},
              "ringzero-gpu-bench JSON: its all_reduce rows")

        # The chart itself.
        out = os.path.join(d, "chart.png")
        p = run(py, plot, jpath, cpath, mpi, gpu, "--label", "local json", "--label", "local csv", "--split", "requested",
                "--title", "test", "-o", out)
        check(p.returncode == 0, f"plot.py: exit status {p.returncode}")
        size = png_size(out) if os.path.exists(out) else None
        check(size == (880, 495), f"chart: PNG of size {size}, expected 880 x 495 (8 x 4.5 in at 110 dpi)")

        # Failures: exit 2 with a message, no chart.
        empty = os.path.join(d, "empty.json")
        with open(empty, "w", encoding="utf-8") as f:
            f.write('{"program": "ringzero-bench", "rows": []}\n')
        for args, words in (([empty], "no rows"), ([os.path.join(d, "missing.csv")], "cannot read"),
                            ([jpath, "--label", "a", "--label", "b"], "--label")):
            bad = os.path.join(d, "bad.png")
            p = run(py, plot, *args, "-o", bad)
            check(p.returncode == 2 and words in p.stderr and not os.path.exists(bad),
                  f"plot.py {args}: exit status {p.returncode}, expected 2 and '{words}' with no chart")
    return finish()


if __name__ == "__main__":
    sys.exit(main())
