"""Every C++ and CUDA source of the repository is laid out as .clang-format says: runs
`clang-format --dry-run --Werror` on each and lists the files it would change. Debian 12's
clang-format (14) is the reference; scripts/install_deps.sh installs it.

usage: scripts/check_format.py CLANG_FORMAT SOURCE_ROOT
"""
import os
import subprocess
import sys

clang_format, root = sys.argv[1], sys.argv[2]
folders = ("include", "src", "tests", "examples", "bench", "tools", "cuda")
suffixes = (".hpp", ".cpp", ".cu", ".cuh", ".h")
files = []
for folder in folders:
    for dirpath, dirnames, filenames in os.walk(os.path.join(root, folder)):
        dirnames[:] = [d for d in dirnames if not d.startswith("build")]
        files += [os.path.join(dirpath, f) for f in filenames if f.endswith(suffixes)]
if not files:
    print(f"FAIL: no sources found under {root}")
    sys.exit(1)
# One clang-format process for every file; its diagnostics ("path:line:col: error: code should be
# clang-formatted") name the files it would change.
r = subprocess.run([clang_format, "--dry-run", "--Werror", f"--style=file:{os.path.join(root, '.clang-format')}",
                    *sorted(files)], capture_output=True, text=True)
unformatted = sorted({line.split(":", 1)[0] for line in r.stderr.splitlines() if "error: code should be clang-formatted" in line})
unformatted = [os.path.relpath(p, root) for p in unformatted]
if r.returncode != 0 and not unformatted:
    print(f"FAIL: clang-format exited {r.returncode}: {r.stderr.strip()[:2000]}")
    sys.exit(1)
for path in unformatted:
    print(f"not formatted: {path} (run: clang-format -i {path})")
print(f"{len(files) - len(unformatted)} of {len(files)} sources formatted as .clang-format says")
sys.exit(1 if unformatted else 0)
