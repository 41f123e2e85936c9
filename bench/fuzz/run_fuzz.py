"""Run the reader fuzzer: N hypothesis cases per format, a per-case timeout, counts of crashes and hangs.

Usage (from the repository root)::

    python bench/fuzz/run_fuzz.py                     # 10000 cases for each format, 2 at a time
    python bench/fuzz/run_fuzz.py -n 500 -f pt -f npz # fewer cases, some formats
    python bench/fuzz/run_fuzz.py --worker pt 100 0   # (internal) one worker

Each format runs in its own worker process (``--worker``); the worker prints one line per case.
A per-case alarm (``--timeout``, default 10 s) counts a hang; if the worker itself stops
answering for 3x the timeout (a hang inside C code) it is killed, counted as one hang, and a
fresh worker with another hypothesis seed goes on with the remaining cases. Results go to
``bench/fuzz/results/<format>.log`` and a summary table is printed (and written as JSON with
``--json``). Exit status 1 when any crash or hang was seen.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import selectors
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1]))

import harness  # noqa: E402


class Job:
    def __init__(self, fmt: str, n: int, seed: int, timeout: float, logdir: Path, workroot: Path):
        self.fmt, self.n, self.seed, self.timeout = fmt, n, seed, timeout
        self.counts = collections.Counter()
        self.done = 0
        self.log = open(logdir / f"{fmt}.log", "w")
        self.workroot = workroot
        self.proc = None
        self.buf = b""
        self.t0 = time.time()
        self.start()

    def start(self):
        wd = self.workroot / f"{self.fmt}-{self.seed}"
        env = dict(os.environ, PYTHONPATH=str(HERE.parents[1]), TF_CPP_MIN_LOG_LEVEL="3",
                   RNNCONVERT_READ_TIMEOUT=str(max(self.timeout / 2, 1)),
                   CUDA_VISIBLE_DEVICES="")
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "run_fuzz.py"), "--worker", self.fmt, str(self.n - self.done),
             str(self.seed), str(self.timeout), str(wd)],
            stdout=subprocess.PIPE, stderr=open(wd.parent / f"{self.fmt}-{self.seed}.stderr", "w"), env=env)
        self.last = time.time()
        self.started = time.time()

    def feed(self, chunk: bytes):
        self.buf += chunk
        while b"\n" in self.buf:
            line, self.buf = self.buf.split(b"\n", 1)
            parts = line.decode(errors="replace").split(" ", 2)
            if len(parts) < 2 or not parts[0].isdigit():
                continue
            self.done += 1
            self.counts[parts[1]] += 1
            self.last = time.time()
            if self.done % 2000 == 0:
                print(f"  {self.fmt}: {self.done} cases, {time.time() - self.t0:.0f}s", flush=True)
            if parts[1] in ("crash", "hang", "wrapped", "guarded_hang", "guarded_crash"):
                self.log.write(f"{self.done} seed={self.seed} {line.decode(errors='replace')}\n")
                self.log.flush()

    def check(self, startup: float) -> bool:
        """True while running; restarts a worker that hangs or dies early."""
        rc = self.proc.poll()
        if rc is not None and self.done < self.n:
            if time.time() - self.last > 0:
                self.counts["crash" if rc else "hang"] += 0  # a dead worker is reported below
            self.log.write(f"worker exited rc={rc} after {self.done} cases; restarting\n")
            self.counts["worker_died"] += 1
            self.done += 1  # the case it died on
            self.counts["crash"] += 1
            self.seed += 1000
            self.start()
            return True
        limit = startup if self.done == 0 else 3 * self.timeout
        if rc is None and time.time() - self.last > limit and time.time() - self.started > limit:
            self.proc.kill()
            self.proc.wait()
            self.log.write(f"worker silent > {limit}s after {self.done} cases: counted as a hang\n")
            self.done += 1
            self.counts["hang"] += 1
            self.seed += 1000
            if self.done < self.n:
                self.start()
                return True
        return self.done < self.n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=10000, help="cases per format (default 10000)")
    ap.add_argument("-f", "--format", action="append", choices=harness.FORMATS)
    ap.add_argument("-j", "--jobs", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=10.0, help="per-case timeout in seconds")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--logdir", default=str(HERE / "results"))
    ap.add_argument("--json")
    ap.add_argument("--worker", nargs=5, metavar=("FMT", "N", "SEED", "TIMEOUT", "WORKDIR"))
    a = ap.parse_args(argv)
    if a.worker:
        fmt, n, seed, timeout, wd = a.worker
        harness.run_worker(fmt, int(n), int(seed), float(timeout), Path(wd))
        return 0
    fmts = a.format or list(harness.FORMATS)
    logdir = Path(a.logdir)
    logdir.mkdir(parents=True, exist_ok=True)
    workroot = Path(tempfile.mkdtemp(prefix="rnnconvert-fuzz-"))
    pending, running, finished = list(fmts), [], []
    sel = selectors.DefaultSelector()
    t0 = time.time()
    while pending or running:
        while pending and len(running) < a.jobs:
            job = Job(pending.pop(0), a.n, a.seed, a.timeout, logdir, workroot)
            running.append(job)
        for job in running:
            try:
                sel.register(job.proc.stdout, selectors.EVENT_READ, job)
            except (KeyError, ValueError):
                pass
        for key, _ in sel.select(timeout=1.0):
            job = key.data
            chunk = os.read(key.fileobj.fileno(), 65536)
            if chunk:
                job.feed(chunk)
            else:
                sel.unregister(key.fileobj)
        for job in list(running):
            old = job.proc
            alive = job.check(startup=600.0)
            if job.proc is not old:
                try:
                    sel.unregister(old.stdout)
                except (KeyError, ValueError):
                    pass
            if not alive:
                job.proc.wait()
                try:
                    sel.unregister(job.proc.stdout)
                except (KeyError, ValueError):
                    pass
                job.elapsed = time.time() - job.t0
                running.remove(job)
                finished.append(job)
                print(f"{job.fmt}: {job.done} cases in {job.elapsed:.0f}s {dict(job.counts)}", flush=True)
    rows = {j.fmt: {"cases": j.done, "ok": j.counts["ok"], "refused": j.counts["refused"],
                    "wrapped": j.counts["wrapped"], "guarded_hangs": j.counts["guarded_hang"],
                    "guarded_crashes": j.counts["guarded_crash"], "crashes": j.counts["crash"], "hangs": j.counts["hang"],
                    "seconds": round(j.elapsed)} for j in finished}
    print(f"{'format':12} {'cases':>6} {'ok':>6} {'refused':>8} {'wrapped':>8} {'g_hangs':>8} {'g_crash':>8} "
          f"{'crashes':>8} {'hangs':>6}")
    for f, r in rows.items():
        print(f"{f:12} {r['cases']:6} {r['ok']:6} {r['refused']:8} {r['wrapped']:8} {r['guarded_hangs']:8} {r['guarded_crashes']:8} {r['crashes']:8} {r['hangs']:6}")
    print(f"total {time.time() - t0:.0f}s; logs in {logdir}")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 1 if any(r["crashes"] or r["hangs"] for r in rows.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
