"""The peer for Keras -> ONNX (issue #30): tf2onnx's command line on our whole-model fixtures, as shipped.

Not a dependency of rnnconvert: install it beside the project to measure (it pins its own onnx/protobuf
needs; ``--no-deps`` keeps the project's), e.g.

    python -m venv --system-site-packages /tmp/t2o && /tmp/t2o/bin/pip install --no-deps tf2onnx
    PYTHONPATH=/tmp/t2o/lib/python3.11/site-packages .venv/bin/python bench/tf2onnx_peer.py

For each file: whether ``python -m tf2onnx.convert --keras FILE --opset 14`` writes a model, which recurrent
ops the model holds (native ``LSTM``/``GRU``/``RNN`` nodes, or ``Loop``/``Scan`` graphs), and, for a model
written, the largest difference from the fixture's tf_keras oracle (``out__0``) in onnxruntime.
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def _oracle(f: Path) -> tuple[list[np.ndarray], np.ndarray]:
    """The fixture's tf_keras oracle: (inputs in order, first output); Mycroft: TensorFlow's frozen graph."""
    if f.suffix == ".net":
        z = np.load(f.parent / "oracle_out.npz")
        return [z["x"]], z["model_out"]
    z = np.load(f.with_suffix(".npz"))
    return [z[k] for k in z.files if k.startswith("in__")], z["out__0"]


def main() -> None:
    import onnx
    import onnxruntime as ort

    files = sorted(glob.glob(str(ROOT / "fixtures/keras_whole/whole_*.h5")))
    files += sorted(glob.glob(str(ROOT / "fixtures/whole_graph/whole30_*.h5")))
    files += [str(ROOT / "fixtures/realworld/mycroft-precise-gru/hey-mycroft.net")]
    env = {**os.environ, "TF_USE_LEGACY_KERAS": "1", "CUDA_VISIBLE_DEVICES": ""}
    done = correct = 0
    with tempfile.TemporaryDirectory() as tmp:
        for f in files:
            out = os.path.join(tmp, Path(f).name + ".onnx")
            r = subprocess.run([sys.executable, "-m", "tf2onnx.convert", "--keras", f, "--output", out,
                                "--opset", "14"], capture_output=True, text=True, env=env, timeout=600)
            if r.returncode != 0 or not os.path.exists(out):
                err = [ln for ln in r.stderr.splitlines() if "Error" in ln or "error" in ln]
                print(f"{Path(f).name}: FAILED ({(err or r.stderr.splitlines() or [''])[-1][:160]})")
                continue
            m = onnx.load(out)
            ops = Counter(n.op_type for n in m.graph.node)
            rec = {k: v for k, v in ops.items() if k in ("LSTM", "GRU", "RNN", "Loop", "Scan") or "RNN" in k}
            diff = ""
            ins, ref = _oracle(Path(f))
            try:
                s = ort.InferenceSession(out, providers=["CPUExecutionProvider"])
            except Exception as exc:  # noqa: BLE001 - e.g. a TensorFlow-only op left in the graph
                print(f"{Path(f).name}: written, but onnxruntime cannot load it "
                      f"({str(exc).split('Error ')[-1][:100]}); recurrent ops {rec}")
                continue
            feeds = {}
            for i, x in zip(s.get_inputs(), ins):
                dt = np.int32 if "int32" in i.type else np.int64 if "int64" in i.type else np.float32
                feeds[i.name] = x.astype(dt)
            try:
                ys = s.run(None, feeds)  # tf2onnx orders outputs its own way: the one of the oracle's shape
                y = next((o for o in ys if o.shape == ref.shape), ys[0])
                err, tol = float(np.abs(y - ref).max()), 2e-5 * max(1.0, float(np.abs(ref).max()))
                correct += err <= tol
                diff = f"; max|d| {err:.3g} (tolerance {tol:.3g}){'' if err <= tol else ' WRONG'}"
            except Exception as exc:  # noqa: BLE001
                diff = f"; onnxruntime: {str(exc).splitlines()[0][:100]}"
            done += 1
            print(f"{Path(f).name}: converted; recurrent ops {rec or 'none (unrolled)'}{diff}")
    print(f"tf2onnx wrote a model onnxruntime runs for {done} of {len(files)}; {correct} within 2e-5 relative")


if __name__ == "__main__":
    main()
