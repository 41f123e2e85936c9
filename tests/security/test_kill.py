"""Atomic output: a CLI conversion killed with SIGKILL at 50 seeded random moments leaves DST with its
previous content or the complete new file, never anything else; SRC is never changed. Temporaries
``.<name>.*.rnnconvert-tmp`` may remain after SIGKILL (docs/security.md)."""

from __future__ import annotations

import hashlib
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "fixtures" / "keras" / "bidi_lstm_concat.h5"


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _cmd(dst: Path) -> list[str]:
    return [sys.executable, "-m", "rnnconvert", str(SRC), str(dst), "--force", "--no-verify"]


def test_sigkill_at_random_moments_leaves_dst_intact(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    src_sum = _sha(SRC)
    ref = tmp_path / "ref.npz"
    t0 = time.monotonic()
    subprocess.run(_cmd(ref), check=True, env=env, capture_output=True)
    full = time.monotonic() - t0
    new_sum = _sha(ref)
    dst = tmp_path / "out.npz"
    dst.write_bytes(b"previous content")
    old_sum = _sha(dst)
    rng = random.Random(20261121)
    seen = {"old": 0, "new": 0}
    for _ in range(50):
        proc = subprocess.Popen(_cmd(dst), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0.2, 1.1) * full)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        now = _sha(dst)
        assert now in (old_sum, new_sum), "DST is neither its previous content nor the complete new file"
        seen["old" if now == old_sum else "new"] += 1
        if now == new_sum:  # put the previous content back for the next round
            dst.write_bytes(b"previous content")
        assert _sha(SRC) == src_sum
    leftovers = [p.name for p in tmp_path.iterdir() if p.name not in ("ref.npz", "out.npz")]
    assert all(n.startswith(".out.npz.") and n.endswith(".rnnconvert-tmp") for n in leftovers), leftovers
    assert seen["old"] > 0
