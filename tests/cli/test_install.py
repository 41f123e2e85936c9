"""What an install holds: one TensorFlow in ``.[test]``, and a plain install (numpy, h5py, typer, rich, threadpoolctl)
that converts to .pt, .npz and .safetensors.

* :func:`test_one_tensorflow_installed` checks the environment running the suite. It runs in CI
  (``CI`` set, as ``.ci/run`` does after the README's fresh install) or with
  ``RNNCONVERT_CHECK_INSTALL=1``; a hand-made development environment may hold older leftovers.
* :func:`test_plain_install_converts` runs only when ``RNNCONVERT_PLAIN_PYTHON`` names the Python of an
  environment made with ``pip install /path/to/rnnconvert`` (no extra), e.g.
  ``python3 -m venv /tmp/plain && /tmp/plain/bin/pip install -e . &&
  RNNCONVERT_PLAIN_PYTHON=/tmp/plain/bin/python pytest tests/cli/test_install.py``.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
from importlib import metadata

import numpy as np
import pytest

from conftest import FIXTURES, ROOT

#: Distributions that each install a ``tensorflow/`` package folder (two of them overwrite each other's files).
TENSORFLOWS = {"tensorflow", "tensorflow-cpu", "tensorflow-intel", "tensorflow-macos", "tensorflow-aarch64",
               "tf-nightly", "tf-nightly-cpu", "intel-tensorflow"}


def _installed() -> set[str]:
    return {(d.metadata["Name"] or "").lower().replace("_", "-") for d in metadata.distributions()}


@pytest.mark.skipif(not (os.environ.get("CI") or os.environ.get("RNNCONVERT_CHECK_INSTALL") == "1"),
                    reason="checks the installed set of a fresh install: runs in CI or with RNNCONVERT_CHECK_INSTALL=1")
def test_one_tensorflow_installed():
    tfs = sorted(_installed() & TENSORFLOWS)
    assert len(tfs) <= 1, f"several TensorFlow distributions share one tensorflow/ folder: {tfs}"
    if "tf-keras" in _installed():
        assert tfs, "tf-keras is installed without the TensorFlow it requires"


def test_tensorflow_extra_names_one_tensorflow():
    """pyproject: the tensorflow extra depends on one TensorFlow distribution (tf-keras requires
    ``tensorflow`` itself, so that is the one)."""
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    names = {r.split(";")[0].split("[")[0].split("=")[0].split("<")[0].split(">")[0].strip().lower()
             for r in extras["tensorflow"]}
    assert names & TENSORFLOWS == {"tensorflow"}
    pins = [ln.split("==")[0].strip() for ln in (ROOT / "constraints.txt").read_text().splitlines()
            if "==" in ln and not ln.startswith("#")]
    assert set(pins) & TENSORFLOWS == {"tensorflow"}


PLAIN = os.environ.get("RNNCONVERT_PLAIN_PYTHON")


@pytest.mark.skipif(not PLAIN, reason="set RNNCONVERT_PLAIN_PYTHON to the Python of a plain (no extra) install")
def test_plain_install_converts(tmp_path):
    torch = pytest.importorskip("torch")
    st = pytest.importorskip("safetensors.numpy")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    probe = subprocess.run([PLAIN, "-c", "import importlib.util as u; print([m for m in ('torch', 'tensorflow', "
                            "'tf_keras', 'keras', 'onnx', 'onnxruntime', 'safetensors') if u.find_spec(m)])"],
                           capture_output=True, text=True, env=env, check=True)
    assert probe.stdout.strip() == "[]", f"not a plain install: {probe.stdout}"
    src = FIXTURES / "keras" / "cudnn_lstm.h5"
    for ext in ("pt", "npz", "safetensors"):
        r = subprocess.run([PLAIN, "-m", "rnnconvert", str(src), str(tmp_path / f"m.{ext}"), "--no-verify"],
                           capture_output=True, text=True, env=env, timeout=300)
        assert r.returncode == 0 and r.stderr == "", r.stderr
    # the same bytes as the libraries write
    sd = torch.load(tmp_path / "m.pt", weights_only=True)
    buf = io.BytesIO()
    torch.save({k: v.clone() for k, v in sd.items()}, buf)
    assert (tmp_path / "m.pt").read_bytes() == buf.getvalue()
    from rnnconvert.formats.storage import safetensors_fmt

    st.save_file({k: v.numpy() for k, v in sd.items()}, str(tmp_path / "lib.safetensors"),
                 metadata=safetensors_fmt.METADATA)
    assert (tmp_path / "m.safetensors").read_bytes() == (tmp_path / "lib.safetensors").read_bytes()
    # a check that needs an extra the plain install lacks: done without it, or refused naming the extra
    r = subprocess.run([PLAIN, "-m", "rnnconvert", str(src), str(tmp_path / "v.onnx")], capture_output=True,
                       text=True, env=env, timeout=300)
    assert r.returncode == 7 and "rnnconvert[onnx]" in r.stderr and "onnxruntime" in r.stderr, r.stderr
    assert not (tmp_path / "v.onnx").exists()


def test_safetensors_read_without_the_library(tmp_path):
    """rnnconvert's own safetensors reader (plain install) against the library's, on a file the library wrote."""
    st = pytest.importorskip("safetensors.numpy")
    from rnnconvert.formats.storage import safetensors_fmt

    rng = np.random.default_rng(5)
    d = {"a.weight_ih_l0": rng.standard_normal((8, 3)).astype(np.float32), "n": np.arange(4, dtype=np.int64),
         "h": rng.standard_normal(5).astype(np.float16), "e": np.zeros((0, 2), np.float64), "s": np.array(True)}
    st.save_file(d, str(tmp_path / "x.safetensors"), metadata={"k": "v"})
    want, got = st.load_file(str(tmp_path / "x.safetensors")), safetensors_fmt.load_own(tmp_path / "x.safetensors")
    assert list(got) == list(want)
    for k in want:
        assert got[k].dtype == want[k].dtype and got[k].shape == want[k].shape and np.array_equal(got[k], want[k])
    bad = tmp_path / "bad.safetensors"
    raw = (tmp_path / "x.safetensors").read_bytes()
    bad.write_bytes(raw[:-3])  # truncated data: a tensor now ends outside the file
    from rnnconvert.errors import FormatError

    with pytest.raises(FormatError, match="bad header record"):
        safetensors_fmt.load_own(bad)


@pytest.mark.parametrize("ext", ["safetensors", "npz"])
def test_outputs_written_with_libraries_blocked(tmp_path, ext):
    """.safetensors and .npz output in a process where torch, safetensors and TensorFlow cannot be imported."""
    code = ("import sys\n"
            "class B:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name.split('.')[0] in ('torch', 'safetensors', 'tensorflow', 'tf_keras', 'keras', 'onnx'):\n"
            "            raise ImportError(name + ' is blocked')\n"
            "sys.meta_path.insert(0, B())\n"
            "from rnnconvert import cli\n"
            "sys.exit(cli.main(sys.argv[1:]))\n")
    out = tmp_path / f"m.{ext}"
    r = subprocess.run([sys.executable, "-c", code, str(FIXTURES / "keras" / "cudnn_lstm.h5"), str(out), "--no-verify"],
                       capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert r.returncode == 0, r.stderr
    import rnnconvert

    a, b = rnnconvert.load(out), rnnconvert.load(FIXTURES / "keras" / "cudnn_lstm.h5")
    for la, lb in zip(a.layers, b.layers):
        for k, v in la.params[0][0].arrays().items():
            assert np.array_equal(v, lb.params[0][0].arrays()[k])


_BLOCK_TORCH = ("import sys\n"
                "class B:\n"
                "    def find_spec(self, name, path=None, target=None):\n"
                "        if name.split('.')[0] in ('torch', 'safetensors'):\n"
                "            raise ImportError(name + ' is blocked')\n"
                "sys.meta_path.insert(0, B())\n"
                "from rnnconvert import cli\n"
                "sys.exit(cli.main(sys.argv[1:]))\n")


def _without_torch(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _BLOCK_TORCH, *args], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)


@pytest.mark.parametrize("ext", ["pt", "safetensors"])
def test_verified_without_torch_and_a_broken_file_still_fails(tmp_path, ext):
    """Without torch (a plain install), a verified conversion to .pt/.safetensors runs both comparisons in
    the numpy reference on the arrays read back from the written file, and says so; that fallback is
    still a check that can fail: the f and g gate blocks of a layer swapped in the written file (torch
    edits it here, in the parent) fail ``verify`` with exit 5 (VerificationError)."""
    torch = pytest.importorskip("torch")
    src, out = FIXTURES / "keras" / "cudnn_lstm.h5", tmp_path / f"m.{ext}"
    r = _without_torch(str(src), str(out), "-v")  # -v: the check's routes (the short line omits them)
    assert r.returncode == 0, r.stderr
    assert "numpy reference on the arrays read back from the written file" in r.stdout
    assert "torch is not installed" in r.stdout
    if ext != "pt":
        return
    sd = torch.load(out, weights_only=True)
    key = next(k for k in sd if k.endswith("weight_hh_l0"))
    H = sd[key].shape[0] // 4
    for name in [key, key.replace("weight_hh", "weight_ih")]:
        w = sd[name].clone()
        w[H:2 * H], w[2 * H:3 * H] = sd[name][2 * H:3 * H], sd[name][H:2 * H]  # i f g o -> i g f o
        sd[name] = w
    broken = tmp_path / "broken.pt"
    torch.save(sd, broken)
    r = _without_torch("verify", str(src), str(broken))
    assert r.returncode == 5, (r.stdout, r.stderr)
