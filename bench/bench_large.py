"""Large-checkpoint benchmark (issues 7 and #18): run by hand after ``bench/gen_large.py``; results go in
docs/performance.md.

    .venv/bin/python bench/bench_large.py [--dir /tmp/rnnbench] [--dtypes f32,f16] [--cache cold|warm]
                                          [--only h5-pt,pt-onnx,tf-pt,pt-safetensors,pt-npz,h5-npz,pt-h5]
                                          [--repeat N] [--no-verify-cmd] [--exe PATH] [--json-out F]

For each conversion (``keras_<dt>.h5 -> .pt``, ``torch_<dt>.pt -> .onnx`` / ``.safetensors`` / ``.npz``,
``tfckpt_<dt>/ -> .pt``; the default ``--only`` is issue #18's four) it measures, each in a fresh process
writing beside the source (same disk), ``--repeat`` times alternating so that a burst of load hits all alike:

* ``cp SRC X && sync X`` (rnnconvert fsyncs its output before the rename, so ``cp`` is synced too);
* ``rnnconvert SRC DST --no-verify`` and ``rnnconvert SRC DST`` (the default, verified): wall time and peak
  RSS (``/usr/bin/time -v``, "Maximum resident set size"), the verdict and the verification seconds from
  ``--json``;
* ``cp`` of every file of DST (an ONNX model's external data too), and ``rnnconvert verify SRC DST``
  (its exit status is its verdict).

Goals (issue #18), each against ``cp`` of the same file in the same run: the verified conversion at most
1.5x ``cp`` with peak RSS at most 0.5x the file; ``--no-verify`` at most 1.2x ``cp``; ``verify SRC DST`` at
most 1.2x ``cp`` of SRC plus ``cp`` of DST. ``--cache cold`` drops the page cache (``sync; echo 3 >
/proc/sys/vm/drop_caches``, needs root) before every timed command; ``warm`` reads nothing first.
``--exe``: the ``rnnconvert`` to time (default: this venv's). Outputs are deleted after each row.
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


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else "-"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/tmp/rnnbench")
    ap.add_argument("--dtypes", default="f32,f16")
    ap.add_argument("--cache", choices=("cold", "warm"), default="cold")
    ap.add_argument("--only", default="h5-pt,pt-onnx,tf-pt,pt-safetensors")
    ap.add_argument("--json-out", default=None, help="also write the rows as JSON here")
    ap.add_argument("--repeat", type=int, default=1, help="median of N runs of each command")
    ap.add_argument("--no-verify-cmd", action="store_true", help="skip the `rnnconvert verify SRC DST` rows")
    ap.add_argument("--exe", default=str(EXE), help="the rnnconvert executable to time (another checkout's venv)")
    args = ap.parse_args()
    exe = args.exe
    d = Path(args.dir)
    if args.cache == "cold" and not drop_caches():
        print("cannot drop the page cache (not root?): falling back to --cache warm", file=sys.stderr)
        args.cache = "warm"
    rows = []
    for dt in args.dtypes.split(","):
        for conv in args.only.split(","):
            s, o = CONVERSIONS[conv]
            src, dst = d / s.format(dt=dt), d / o.format(dt=dt)
            size = size_of(src)
            sync = "sync" if src.is_dir() else f"sync '{d}/cp.tmp'"
            cps, cpds, nvs, vs, vcs = [], [], [], [], []
            rep = vrep = None
            written = 0
            for _ in range(args.repeat):  # alternating, so that a burst of load hits every command alike
                cps.append(timed(["sh", "-c", f"cp -r '{src}' '{d}/cp.tmp' && {sync}"], args.cache)[0])
                subprocess.run(["rm", "-rf", str(d / "cp.tmp")], check=True)
                nvs.append(timed([exe, str(src), str(dst), "--force", "--quiet", "--no-verify"], args.cache))
                cleanup(dst)
                v = timed([exe, str(src), str(dst), "--force", "--quiet", "--json"], args.cache)
                vs.append(v)
                rep = json.loads(v[2])
                written = out_size(dst)
                if not args.no_verify_cmd:
                    # cp of SRC + DST (the bytes `verify` must read), then `rnnconvert verify SRC DST`
                    # every file of DST (an ONNX model's external data beside it, a TF checkpoint's files)
                    cpds.append(timed(["sh", "-c", f"mkdir '{d}/cpd.tmp' && cp -r '{dst}'* '{d}/cpd.tmp/' && sync"],
                                      args.cache)[0])
                    subprocess.run(["rm", "-rf", str(d / "cpd.tmp")], check=True)
                    vc = timed_rc([exe, "verify", str(src), str(dst), "--json"], args.cache)
                    vcs.append(vc)
                    vrep = vc[2]
                cleanup(dst)
            med = statistics.median
            cp_s = med(cps)
            nv_s, v_s = med(t for t, _, _ in nvs), med(t for t, _, _ in vs)
            ver = rep["verification"]
            row = dict(conv=conv, dtype=dt, src_bytes=size, out_bytes=written, cp_s=cp_s, cp_runs=cps,
                       convert_s=nv_s, convert_runs=[t for t, _, _ in nvs], convert_rss=max(r for _, r, _ in nvs),
                       verified_s=v_s, verified_runs=[t for t, _, _ in vs], verified_rss=max(r for _, r, _ in vs),
                       verify_s=ver["seconds"], verdict=ver.get("verdict", "ok" if ver["ok"] else "FAIL"),
                       cache=args.cache)
            if vcs:
                row.update(cp_dst_s=med(cpds), verify_cmd_s=med(t for t, _, _ in vcs),
                           verify_cmd_runs=[t for t, _, _ in vcs], verify_cmd_rss=max(r for _, r, _ in vcs),
                           verify_cmd_verdict=vrep)
            row.update(time_ok=v_s <= 1.5 * cp_s, nv_time_ok=nv_s <= 1.2 * cp_s,
                       mem_ok=row["verified_rss"] <= 0.5 * size,
                       verify_cmd_ok=(row["verify_cmd_s"] <= 1.2 * (cp_s + row["cp_dst_s"])) if vcs else None)
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(rows, indent=1))
    gb = 1e9
    yn = {True: "yes", False: "no", None: "-"}
    print("\n| conversion | dtype | file GB | cp s | verified s (x cp) | peak RSS GB (x file) | verification s "
          "| --no-verify s (x cp) | cp SRC+DST s | `verify` s (x cp) | goals verified/no-verify/RSS/verify |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        cpsd = r["cp_s"] + r.get("cp_dst_s", 0.0)
        vc = (f"{r['verify_cmd_s']:.1f} ({ratio(r['verify_cmd_s'], cpsd)})" if "verify_cmd_s" in r else "-")
        print(f"| {r['conv']} | {r['dtype']} | {r['src_bytes'] / gb:.2f} | {r['cp_s']:.1f} | {r['verified_s']:.1f} "
              f"({ratio(r['verified_s'], r['cp_s'])}) | {r['verified_rss'] / gb:.2f} "
              f"({r['verified_rss'] / r['src_bytes']:.2f}x) | {r['verify_s']:.1f} | {r['convert_s']:.1f} "
              f"({ratio(r['convert_s'], r['cp_s'])}) | {cpsd:.1f} | {vc} | {yn[r['time_ok']]}/{yn[r['nv_time_ok']]}/"
              f"{yn[r['mem_ok']]}/{yn[r['verify_cmd_ok']]} |")


def timed_rc(cmd: list[str], cache: str) -> tuple[float, float, str]:
    """:func:`timed` for ``rnnconvert verify``, whose exit status is its verdict (0 ok, 5 fail, 9
    inconclusive): returns (wall s, peak RSS bytes, verdict word)."""
    if cache == "cold":
        drop_caches()
    t0 = time.perf_counter()
    r = subprocess.run(["/usr/bin/time", "-v", *cmd], capture_output=True, text=True)
    wall = time.perf_counter() - t0
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", r.stderr).group(1)) * 1024
    verdict = {0: "ok", 5: "FAIL", 9: "inconclusive"}.get(r.returncode)
    if verdict is None:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}")
    return wall, rss, verdict


if __name__ == "__main__":
    main()
