"""Issue #33, second GPU-machine run: the verified conversion's wall time against the threads it is given
(``RNNCONVERT_THREADS``: the products split between pool threads; ``RNNCONVERT_BLAS_THREADS``: BLAS's own threads
instead), pinned to 2 cores, and the cuDNN routes, each a fresh process timed by ``device_table.timed``.

    python3 bench/device_sweep.py BIG.h5 [--json-out F]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from device_table import rm, timed  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("src", type=Path)
    ap.add_argument("--json-out", default=None)
    a = ap.parse_args()
    src, exe = a.src, [sys.executable, "-m", "rnnconvert"]
    dst = src.with_name("out.pt")
    cpx = src.with_name("cp.tmp")
    rows = []

    def run(name, cmd, cpus="", env=None, keep=False):
        if not keep:
            rm(dst)
        g = timed(cmd, cpus, env)
        g["name"] = name
        rows.append(g)
        print(f"{name:44s} {g['wall']:7.2f} s  cpu {g['cpu']:7.1f} s  rss {g['rss'] / 1e9:5.2f} GB  exit {g['rc']}",
              flush=True)

    conv = [*exe, str(src), str(dst), "-q", "--json"]
    run("cp+sync SRC", ["sh", "-c", f"cp {src} {cpx} && sync {cpx}; rm -f {cpx}"])
    run("convert --no-verify", [*exe, str(src), str(dst), "--no-verify", "-q"])
    for n in (1, 2, 4, 16):
        run(f"convert (verified), threads {n}", conv, env={"RNNCONVERT_THREADS": str(n)})
    run("convert (verified), threads 16, 8 MiB blocks", conv, env={"RNNCONVERT_THREADS": "16",
                                                                  "RNNCONVERT_BLOCK_BYTES": str(8 << 20)})
    run("convert (verified), threads 1, BLAS 16", conv, env={"RNNCONVERT_THREADS": "1", "RNNCONVERT_BLAS_THREADS": "16"})
    run("convert (verified), threads 1, BLAS 4", conv, env={"RNNCONVERT_THREADS": "1", "RNNCONVERT_BLAS_THREADS": "4"})
    run("convert --no-verify, 2 cores", [*exe, str(src), str(dst), "--no-verify", "-q"], cpus="0,1")
    run("convert (verified), 2 cores, threads 2", conv, cpus="0,1", env={"RNNCONVERT_THREADS": "2"})
    run("convert (verified), 2 cores, threads 1", conv, cpus="0,1", env={"RNNCONVERT_THREADS": "1"})
    run("convert --no-verify (again)", [*exe, str(src), str(dst), "--no-verify", "-q"])
    run("cp+sync DST", ["sh", "-c", f"cp {dst} {cpx} && sync {cpx}; rm -f {cpx}"], keep=True)
    run("verify SRC DST --device cuda", [*exe, "verify", str(src), str(dst), "--device", "cuda", "--json"], keep=True)
    run("convert --device cuda", [*exe, str(src), str(dst), "--device", "cuda", "-q", "--json"])
    if a.json_out:
        Path(a.json_out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
