"""``rnnconvert verify SRC DST.pt2`` loads a file the user names: a crafted ``.pt2`` must not run code.

torch 2.13's ``torch.export.load`` unpickles with ``weights_only=False`` where a payload config says
``use_pickle``, for legacy weight blobs, for object constants, and when the sample inputs fail their
``weights_only=True`` load (``torch/export/pt2_archive/_package.py``, ``torch/_export/serde/serialize.py``). Each
payload here is a correct ``.pt2`` (written by rnnconvert from ``fixtures/keras/lstm.h5``) edited with ``zipfile``
to carry a pickle whose ``__reduce__`` makes a marker folder. Oracles: the marker (it exists only if the code ran;
:func:`test_the_payload_is_real` runs torch's own loader on one payload, in a child, and sees it made) and the
documented exit code 3 (``rnnconvert/errors.py`` ``FormatError``) with one line.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from rnnconvert.errors import FormatError  # noqa: E402
from rnnconvert.safety import pt2_archive  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "fixtures" / "keras" / "lstm.h5"


class _Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return os.mkdir, (self.marker,)


def _pickled(marker: Path) -> bytes:
    buf = io.BytesIO()
    torch.save(_Payload(marker), buf)
    return buf.getvalue()


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("RNNCONVERT_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "rnnconvert", *args], capture_output=True, text=True,
                          timeout=600, env=env, cwd=ROOT)


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("pt2") / "good.pt2"
    r = _cli(str(SRC), str(out), "--no-verify")
    assert r.returncode == 0, r.stderr
    return out


def _edit(good: Path, out: Path, replace: dict[str, bytes], add: dict[str, bytes] | None = None,
          deflate: str | None = None) -> Path:
    with zipfile.ZipFile(good) as z, zipfile.ZipFile(out, "w") as w:
        root = z.namelist()[0].split("/")[0]
        for info in z.infolist():
            tail = info.filename.split("/", 1)[1]
            data = replace.get(tail, z.read(info))
            w.writestr(info.filename, data,
                       compress_type=zipfile.ZIP_DEFLATED if tail == deflate else zipfile.ZIP_STORED)
        for tail, data in (add or {}).items():
            w.writestr(f"{root}/{tail}", data)
    return out


def _weights_config(good: Path) -> dict:
    with zipfile.ZipFile(good) as z:
        name = next(n for n in z.namelist() if n.endswith("model_weights_config.json"))
        return json.loads(z.read(name))


def _attacks(good: Path, d: Path, marker: Path) -> dict[str, Path]:
    evil = _pickled(marker)
    cfg = _weights_config(good)
    first = next(iter(cfg["config"]))
    pickled_cfg = json.loads(json.dumps(cfg))
    pickled_cfg["config"][first]["use_pickle"] = True
    obj_cfg = {"config": {"c0": {"path_name": "custom_obj_0", "use_pickle": False}}}
    return {
        "sample_inputs": _edit(good, d / "samples.pt2", {"data/sample_inputs/model.pt": evil}),
        "use_pickle": _edit(good, d / "use_pickle.pt2", {
            "data/weights/model_weights_config.json": json.dumps(pickled_cfg).encode(),
            f"data/weights/{cfg['config'][first]['path_name']}": evil}),
        "legacy": _edit(good, d / "legacy.pt2", {}, add={"data/weights/model.pt": evil}),
        "object_constant": _edit(good, d / "object.pt2", {
            "data/constants/model_constants_config.json": json.dumps(obj_cfg).encode()},
            add={"data/constants/custom_obj_0": evil}),
        "deflated": _edit(good, d / "deflated.pt2", {}, deflate="models/model.json"),
    }


def test_the_payload_is_real(good, tmp_path):
    """torch's own loader, in a child, runs the sample-inputs payload (the marker appears): the attack is real."""
    marker = tmp_path / "ran"
    bad = _attacks(good, tmp_path, marker)["sample_inputs"]
    code = f"import torch; torch.export.load({str(bad)!r})"
    subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=300)
    assert marker.exists()


@pytest.mark.parametrize("case", ["sample_inputs", "use_pickle", "legacy", "object_constant", "deflated"])
def test_verify_refuses_without_running_the_payload(good, tmp_path, case):
    marker = tmp_path / "ran"
    bad = _attacks(good, tmp_path, marker)[case]
    r = _cli("verify", str(SRC), str(bad))
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 3, r.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("rnnconvert: error: "), r.stderr[-2000:]
    assert not marker.exists()


def test_check_refuses_each_payload(good, tmp_path):
    marker = tmp_path / "ran"
    for case, bad in _attacks(good, tmp_path, marker).items():
        with pytest.raises(FormatError):
            pt2_archive.check(bad)
    assert not marker.exists()
    pt2_archive.check(good)  # what rnnconvert writes passes


def test_loader_closes_unpickling_even_past_the_check(good, tmp_path):
    """Defense in depth: with :func:`check` skipped, the patched loader still refuses the sample-inputs payload
    (its ``weights_only=True`` failure has no ``weights_only=False`` fallback) and restores torch afterwards."""
    marker = tmp_path / "ran"
    bad = _attacks(good, tmp_path, marker)["sample_inputs"]
    real = torch.load
    with pytest.raises(Exception):
        with pt2_archive._weights_only(torch):
            torch.export.load(str(bad))
    assert not marker.exists()
    assert torch.load is real


def test_the_good_program_still_loads_and_verifies(good):
    r = _cli("verify", str(SRC), str(good))
    assert r.returncode == 0, r.stderr[-2000:]
