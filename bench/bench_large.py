"""Large-checkpoint benchmark (issue 7): run by hand after ``bench/gen_large.py``; results go in
docs/performance.md.

    .venv/bin/python bench/bench_large.py [--dir /tmp/rnnbench] [--dtypes f32,f16] [--cache cold|warm]
                                          [--only h5-pt,pt-onnx,pt-safetensors,pt-npz,tf-pt,h5-npz,pt-h5]
                                          [--repeat N]

For each conversion (``keras_<dt>.h5 -> .pt``, ``torch_<dt>.pt -> .onnx`` / ``.safetensors`` / ``.npz``,
``tfckpt_<dt>/ -> .pt``)
it measures, each in a fresh process writing beside the source (same disk):

* ``cp SRC X && sync X`` (rnnconvert fsyncs its output before the rename, so ``cp`` is synced too);
* ``rnnconvert SRC DST --no-verify`` and ``rnnconvert SRC DST`` (verified): wall time and peak RSS
  (``/usr/bin/time -v``, "Maximum resident set size"), and the verification seconds from ``--json``.
  The time and memory targets are judged on the ``--no-verify`` run; the verified run's RSS is shown.

``--cache cold`` drops the page cache (``sync; echo 3 > /proc/sys/vm/drop_caches``, needs root) before
every timed command, so that each reads from disk; ``warm`` reads the source once first. The targets
(issue 7): time <= 2x cp; peak RSS <= 1.25x the file size, and for streamed targets (safetensors,
npz, HDF5) <= the largest layer + 20%; verification <= the conversion time (the verification seconds
reported by the verified run, and the wall time it adds to the conversion). ``--repeat N`` runs ``cp``
and the unverified conversion N times, alternating, and keeps the medians (the VM's disk is shared:
single runs vary by 2-4x).
Outputs are deleted after each row.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

EXE = Path(sys.executable).parent / "rnnconvert"
CONVERSIONS = {
    "h5-pt": ("keras_{dt}.h5", "out_{dt}.pt"),
    "pt-onnx": ("torch_{dt}.pt", "out_{dt}.onnx"),
    "pt-safetensors": ("torch_{dt}.pt", "out_{dt}.safetensors"),
    "pt-npz": ("torch_{dt}.pt", "out_{dt}.npz"),
    "tf-pt": ("tfckpt_{dt}", "out_{dt}.pt"),  # a TF2 checkpoint directory (gen_large --formats tf)
    "h5-npz": ("keras_{dt}.h5", "out_{dt}.npz"),  # streamed target from a Keras source
    "pt-h5": ("torch_{dt}.pt", "out_{dt}.h5"),  # streamed HDF5 target (tf_keras full model)
}
STREAMED = {"safetensors", "npz", "h5"}


def drop_caches() -> bool:
    try:
        subprocess.run(["sync"], check=True)
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def timed(cmd: list[str], cache: str) -> tuple[float, float, str]:
    """Run ``cmd`` under ``/usr/bin/time -v``; returns (wall s, peak RSS bytes, stdout)."""
    if cache == "cold":
        drop_caches()
    t0 = time.perf_counter()
    r = subprocess.run(["/usr/bin/time", "-v", *cmd], capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if r.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}")
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", r.stderr).group(1)) * 1024
    return wall, rss, r.stdout


def largest_layer_bytes(h5: Path) -> int:
    """Bytes of the largest top-level layer group of a Keras HDF5 file (shapes only, no data read)."""
    import h5py

    best = 0
    with h5py.File(h5, "r") as f:
        g = f["model_weights"] if "model_weights" in f else f
        for name in g:
            tot = []
            g[name].visititems(lambda _n, o: tot.append(o.nbytes) if isinstance(o, h5py.Dataset) else None)
            best = max(best, sum(tot))
    return best


def size_of(p: Path) -> int:
    """Bytes of a file, or of all files under a directory (a TF checkpoint)."""
    return sum(q.stat().st_size for q in p.rglob("*") if q.is_file()) if p.is_dir() else p.stat().st_size


def out_size(dst: Path) -> int:
    return sum(p.stat().st_size for p in dst.parent.glob(dst.name + "*"))


def cleanup(dst: Path) -> None:
    for p in dst.parent.glob(dst.name + "*"):
        p.unlink()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/tmp/rnnbench")
    ap.add_argument("--dtypes", default="f32,f16")
    ap.add_argument("--cache", choices=("cold", "warm"), default="cold")
    ap.add_argument("--only", default=",".join(CONVERSIONS))
    ap.add_argument("--json-out", default=None, help="also write the rows as JSON here")
    ap.add_argument("--repeat", type=int, default=1, help="median of N runs of cp and of the conversion")
    args = ap.parse_args()
    d = Path(args.dir)
    if args.cache == "cold" and not drop_caches():
        print("cannot drop the page cache (not root?): falling back to --cache warm", file=sys.stderr)
        args.cache = "warm"
    rows = []
    for dt in args.dtypes.split(","):
        layer = largest_layer_bytes(d / f"keras_{dt}.h5")
        for conv in args.only.split(","):
            s, o = CONVERSIONS[conv]
            src, dst = d / s.format(dt=dt), d / o.format(dt=dt)
            size = size_of(src)
            if args.cache == "warm":
                for q in ([*src.rglob("*")] if src.is_dir() else [src]):
                    q.read_bytes() if q.is_file() else None
            sync = "sync" if src.is_dir() else f"sync '{d}/cp.tmp'"
            cps, nvs = [], []
            for _ in range(args.repeat):  # alternating, so that a burst of load hits both alike
                cps.append(timed(["sh", "-c", f"cp -r '{src}' '{d}/cp.tmp' && {sync}"], args.cache)[0])
                subprocess.run(["rm", "-rf", str(d / "cp.tmp")], check=True)
                nvs.append(timed([str(EXE), str(src), str(dst), "--force", "--quiet", "--no-verify"], args.cache))
                written = out_size(dst)
                cleanup(dst)
            cp_s = statistics.median(cps)
            nv_s = statistics.median(t for t, _, _ in nvs)
            nv_rss = max(r for _, r, _ in nvs)
            v_s, v_rss, out = timed([str(EXE), str(src), str(dst), "--force", "--quiet", "--json"], args.cache)
            rep = json.loads(out)
            cleanup(dst)
            ver = rep["verification"]
            ok = ver["ok"] and all(c["ok"] for c in ver["layers"])
            target = o.rsplit(".", 1)[1]
            mem_limit = min(1.25 * size, 1.2 * layer) if target in STREAMED else 1.25 * size
            row = dict(conv=conv, dtype=dt, src_bytes=size, out_bytes=written, largest_layer=layer, cp_s=cp_s,
                       convert_s=nv_s, convert_rss=nv_rss, verified_s=v_s, verified_rss=v_rss,
                       verify_s=ver["seconds"], verify_added_s=v_s - nv_s, verify_ok=ok, time_ok=nv_s <= 2 * cp_s,
                       cp_runs=cps, convert_runs=[t for t, _, _ in nvs],
                       mem_ok=nv_rss <= mem_limit, mem_limit=mem_limit,
                       verify_time_ok=ver["seconds"] <= nv_s, cache=args.cache)
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(rows, indent=1))
    gb = 1e9
    print("\n| conversion | dtype | file GB | cp s | convert s (x cp) | peak RSS GB (x file) | verified s | "
          "verify s (adds s) | RSS verified GB | targets time/mem/verify |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    yn = {True: "yes", False: "no"}
    for r in rows:
        print(f"| {r['conv']} | {r['dtype']} | {r['src_bytes'] / gb:.2f} | {r['cp_s']:.1f} | {r['convert_s']:.1f} "
              f"({r['convert_s'] / r['cp_s']:.1f}x) | {r['convert_rss'] / gb:.2f} ({r['convert_rss'] / r['src_bytes']:.2f}x) "
              f"| {r['verified_s']:.1f} | {r['verify_s']:.1f} ({r['verify_added_s']:.1f}) | {r['verified_rss'] / gb:.2f} "
              f"({r['verified_rss'] / r['src_bytes']:.2f}x) | {yn[r['time_ok']]}/{yn[r['mem_ok']]}/"
              f"{yn[r['verify_time_ok']]} |")


if __name__ == "__main__":
    main()
