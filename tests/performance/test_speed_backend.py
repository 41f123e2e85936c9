"""The plain fallback of the fast paths (``RNNCONVERT_SPEED=plain``, rnnconvert/speed/backend.py): ``O_DIRECT``,
read-ahead threads, ISA-L CRC-32, the tiled transpose and verification's blocked products all off. The same
conversions, run both ways in fresh processes, write the same bytes and reach the same verdicts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"


def _convert(src: Path, dst: Path, speed: str) -> dict:
    env = {**os.environ, "RNNCONVERT_SPEED": speed}
    r = subprocess.run([sys.executable, "-m", "rnnconvert", str(src), str(dst), "--json"], capture_output=True,
                       text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout)


@pytest.mark.parametrize("src,ext", [("keras/bidi_lstm_concat.h5", "pt"), ("tf/lstm_cell/ckpt", "onnx"),
                                     ("keras/stack_lstm_gru_rnn.h5", "h5")], ids=["keras-pt", "tf1-onnx", "keras-h5"])
def test_plain_and_fast_backends_write_the_same_bytes_with_the_same_verdicts(src, ext, tmp_path):
    fast = _convert(FIXTURES / src, tmp_path / f"fast.{ext}", "fast")
    plain = _convert(FIXTURES / src, tmp_path / f"plain.{ext}", "plain")
    assert (tmp_path / f"fast.{ext}").read_bytes() == (tmp_path / f"plain.{ext}").read_bytes()
    verdicts = lambda rep: [c["verdict"] for c in rep["verification"]["layers"]]  # noqa: E731
    assert verdicts(fast) == verdicts(plain) and set(verdicts(fast)) == {"ok"}


def test_the_switch_turns_each_fast_path_off():
    code = ("from rnnconvert.speed import crc32, directio, kernels, prefetch, transpose; import zlib, numpy as np, "
            "sys; from rnnconvert.core import reference; "
            "print(crc32.crc32 is zlib.crc32, kernels.FAST is reference.PLAIN, directio._open_direct('/dev/null'), "
            "prefetch.prefetch(sys.executable))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "RNNCONVERT_SPEED": "plain"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "True", "-1", "None"]
