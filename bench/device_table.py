"""Issue #33's table on one machine, in one run: ``cp``, the conversion with and without verification (all
cores, and pinned to 2), ``rnnconvert verify`` on the CPU and through cuDNN, and ``convert --device cuda``.

    python3 bench/device_table.py BIG.h5 [--repeat 2] [--json-out F] [--exe "python3 -m rnnconvert"]

Each command runs in a fresh process under a small Python wrapper that reports the wall time and the peak
RSS of that process tree (``RUSAGE_CHILDREN`` of the wrapper: the largest child's); the pinned rows set the
wrapper's CPU affinity first (inherited: ``os.sched_setaffinity``, as ``taskset -c 0,1``). ``--repeat``
runs the pairs alternating (no-verify, verified, no-verify, verified, ...) so that a burst of load hits both;
the table gives the best of the repeats and every run in the JSON. The page cache is dropped before each
timed command with ``--cache cold`` where the machine allows it (root); by default the runs are warm (the source in the
page cache, as ``cp`` reads it). Ratios are
against ``cp SRC X && sync X`` measured in the same run. Results go in docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_large import drop_caches  # noqa: E402

WRAP = r"""
import os, resource, subprocess, sys, time
cpus = os.environ.pop("BENCH_CPUS", "")
if cpus:
    os.sched_setaffinity(0, {int(c) for c in cpus.split(",")})
t0 = time.perf_counter()
r = subprocess.run(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
wall = time.perf_counter() - t0
ru = resource.getrusage(resource.RUSAGE_CHILDREN)
print(repr({"rc": r.returncode, "wall": wall, "rss": ru.ru_maxrss * 1024, "cpu": ru.ru_utime + ru.ru_stime,
            "out": r.stdout[-3000:], "err": r.stderr[-3000:]}))
"""


CACHE = {"cold": False}


def timed(cmd: list[str], cpus: str = "", extra_env: dict | None = None) -> dict:
    import ast

    dropped = drop_caches() if CACHE["cold"] else False
    env = {**os.environ, **({"BENCH_CPUS": cpus} if cpus else {}), **(extra_env or {})}
    r = subprocess.run([sys.executable, "-c", WRAP, *cmd], capture_output=True, text=True, env=env)
    got = ast.literal_eval(r.stdout.strip().splitlines()[-1])
    got.update(cmd=" ".join(cmd), cpus=cpus or "all", cold=dropped)
    if got["rc"] not in (0,):
        print(f"  exit {got['rc']}: {' '.join(cmd)}\n{got['err'][-1500:]}", flush=True)
    return got


def rm(p: Path) -> None:
    for q in p.parent.glob(p.name + "*"):
        q.unlink()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("src", type=Path)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--json-out", default=None)
    ap.add_argument("--exe", default=f"{sys.executable} -m rnnconvert")
    ap.add_argument("--skip-cuda", action="store_true")
    ap.add_argument("--old-exe", default=None, help="also time the code before the change (once each, same machine)")
    ap.add_argument("--cache", choices=("warm", "cold"), default="warm",
                    help="cold: drop the page cache before each command (root); warm (default): the files stay cached")
    a = ap.parse_args()
    CACHE["cold"] = a.cache == "cold"
    exe = shlex.split(a.exe)
    src = a.src
    dst = src.with_name("out.pt")
    size = src.stat().st_size
    rows: dict[str, list] = {}

    def run(name, cmd, cpus="", keep=False):
        if not keep:
            rm(dst)
        got = timed(cmd, cpus)
        rows.setdefault(name, []).append(got)
        print(f"{name:34s} {got['wall']:7.2f} s  cpu {got['cpu']:7.1f} s  rss {got['rss'] / 1e9:5.2f} GB  "
              f"exit {got['rc']}", flush=True)
        return got

    cpx = src.with_name("cp.tmp")
    old = shlex.split(a.old_exe) if a.old_exe else None
    for r in range(a.repeat):  # the pair of the goal, alternating (and the old code's pair beside it)
        run("cp+sync SRC", ["sh", "-c", f"cp {src} {cpx} && sync {cpx}; rm -f {cpx}"])
        run("convert --no-verify", [*exe, str(src), str(dst), "--no-verify", "-q"])
        run("convert (verified)", [*exe, str(src), str(dst), "-q", "--json"])
        if old:
            run("OLD convert --no-verify", [*old, str(src), str(dst), "--no-verify", "-q"])
            run("OLD convert (verified)", [*old, str(src), str(dst), "-q", "--json"])
    run("convert --no-verify, 2 cores", [*exe, str(src), str(dst), "--no-verify", "-q"], cpus="0,1")
    run("convert (verified), 2 cores", [*exe, str(src), str(dst), "-q", "--json"], cpus="0,1")
    run("convert (verified), --threads 1", [*exe, str(src), str(dst), "-q", "--json", "--threads", "1"])
    rm(dst)
    subprocess.run([*exe, str(src), str(dst), "--no-verify", "-q"], check=True)
    run("cp+sync DST", ["sh", "-c", f"cp {dst} {cpx} && sync {cpx}; rm -f {cpx}"], keep=True)
    run("verify SRC DST", [*exe, "verify", str(src), str(dst), "--json"], keep=True)
    for r in range(a.repeat if not a.skip_cuda else 0):
        run("verify SRC DST --device cuda", [*exe, "verify", str(src), str(dst), "--device", "cuda", "--json"],
            keep=True)
    if old:
        run("OLD verify SRC DST", [*old, "verify", str(src), str(dst), "--json"], keep=True)
        if not a.skip_cuda:
            run("OLD verify SRC DST --device cuda", [*old, "verify", str(src), str(dst), "--device", "cuda", "--json"],
                keep=True)
    if not a.skip_cuda:
        for r in range(a.repeat):
            run("convert --device cuda", [*exe, str(src), str(dst), "--device", "cuda", "-q", "--json"])
    rm(dst)

    def best(name):
        return min(rows[name], key=lambda g: g["wall"]) if name in rows else None
    cp = best("cp+sync SRC")["wall"]
    cpd = best("cp+sync DST")["wall"]
    print(f"\nfile {size / 1e9:.2f} GB; page cache dropped before each command: {rows['cp+sync SRC'][0]['cold']}")
    print("| command | wall (best) | CPU | peak RSS | vs cp | RSS / file |")
    print("|---|---|---|---|---|---|")
    for name in rows:
        g = best(name)
        base = cp + cpd if "verify SRC" in name else cp
        print(f"| {name} | {g['wall']:.2f} s | {g['cpu']:.1f} s | {g['rss'] / 1e9:.2f} GB | {g['wall'] / base:.2f}x "
              f"| {g['rss'] / size:.2f}x |")
    nv, v = best("convert --no-verify"), best("convert (verified)")
    print(f"\nverified / --no-verify, all cores: {v['wall'] / nv['wall']:.2f}x")
    nv2, v2 = best("convert --no-verify, 2 cores"), best("convert (verified), 2 cores")
    print(f"verified / --no-verify, 2 cores: {v2['wall'] / nv2['wall']:.2f}x")
    if old:
        onv, ov = best("OLD convert --no-verify"), best("OLD convert (verified)")
        print(f"old code: verified / --no-verify {ov['wall'] / onv['wall']:.2f}x; verified new / old "
              f"{v['wall'] / ov['wall']:.2f}x")
    if "convert --device cuda" in rows:
        print(f"convert --device cuda / --no-verify: {best('convert --device cuda')['wall'] / nv['wall']:.2f}x")
        print(f"verify --device cuda / (cp SRC + cp DST): {best('verify SRC DST --device cuda')['wall'] / (cp + cpd):.2f}x")
    if a.json_out:
        Path(a.json_out).write_text(json.dumps({"size": size, "rows": rows}, indent=1))


if __name__ == "__main__":
    t0 = time.time()
    main()
    print(f"bench: {time.time() - t0:.0f} s", file=sys.stderr)
