#!/usr/bin/env python
"""Issue #41 ("Fast .pt2 and emitted modules"): one forward of whole Keras models at (2, 1000, features), side by side
in one run: onnxruntime on rnnconvert's own ``.onnx``, the ``.pt2`` program (``torch.export.load(...).module()``), the
emitted ``nn.Module`` (``--emit-module``) and tf_keras ``predict_on_batch`` on the source; each output's max |error|
against tf_keras. The models are made by tf_keras here (gate-distinct random weights) plus Mycroft Precise's real
``hey-mycroft.net`` (fixtures/realworld, Apache-2.0):

* ``bigru_hs``: Masking -> Bidirectional(GRU(64, hard_sigmoid gates, reset_after=False), sequences) -> Dense(3): a
  cell torch.nn cannot compute (the scan form); inputs padded at the end of one row and inside the other.
* ``bigru``: the same with a standard GRU (sigmoid, reset_after=True).
* ``conv_lstm``: Conv1D(32, 5, same, relu) -> LSTM(64, sequences) -> Dense(3): torch's own LSTM kernel.
* ``mycroft``: GRU(20, linear, hard_sigmoid, reset-before, last state) -> Dense(1, sigmoid), 13 features; its
  ``.onnx`` keeps the declared 29 steps (onnxruntime refuses 1000: no ratio), the ``.pt2`` and module run 1000.

``--aoti``: also the AOTInductor route (issue #41's untried one): ``torch._inductor.aoti_compile_and_package`` of the
loaded ``.pt2`` as written (torch 2.13 refuses its dynamic batch and time: the line it prints is recorded), then of
the same program exported again at the benchmark's static shape (from the module the ``.pt2`` writer builds,
``pt2_write.build_module``: re-exporting the loaded program's ``.module()`` fails in torch 2.13, "Can't detach views
in-place"), loaded by ``torch._inductor.aoti_load_package``; its compile time, median forward and max |error| are
printed (GRU models only: the LSTM already meets the goal). ``--only NAME ...`` runs those models.

torch and onnxruntime run on ONE thread (``--threads`` to change): the project machine has 2 cores shared by other
jobs, where a second intra-op thread spin-waits on every tiny per-step op (a 1000-step scan: 0.6 s on one thread,
25 s on two under load). Median of ``--repeat`` calls after one warm-up call. Run:
``.venv/bin/python bench/bench_pt2_speed.py [--steps 1000] [--repeat 5] [--threads 1] [--aoti] [--only bigru_hs ...]``.
"""
import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MYCROFT = ROOT / "fixtures" / "realworld" / "mycroft-precise-gru" / "hey-mycroft.net"
if not MYCROFT.exists():
    MYCROFT = ROOT.parent / "shared" / "realworld" / "mycroft-precise-gru" / "hey-mycroft.net"


def models(d: str):
    import tf_keras as keras

    L = keras.layers
    rng = np.random.default_rng(0)

    def save(m, name):
        for layer in m.layers:
            ws = layer.get_weights()
            if ws:
                layer.set_weights([rng.uniform(-0.4, 0.4, w.shape).astype(np.float32) for w in ws])
        p = os.path.join(d, name + ".h5")
        m.save(p, save_format="h5")
        return name, p, 10

    x = keras.Input((None, 10), name="feats")
    h = L.Masking(0.0)(x)
    h = L.Bidirectional(L.GRU(64, return_sequences=True, reset_after=False, recurrent_activation="hard_sigmoid"),
                        name="bigru")(h)
    yield save(keras.Model(x, L.Dense(3, name="dense")(h), name="bigru_hs"), "bigru_hs")
    x = keras.Input((None, 10), name="feats")
    h = L.Bidirectional(L.GRU(64, return_sequences=True), name="bigru")(L.Masking(0.0)(x))
    yield save(keras.Model(x, L.Dense(3, name="dense")(h), name="bigru"), "bigru")
    x = keras.Input((None, 10), name="feats")
    h = L.Conv1D(32, 5, padding="same", activation="relu", name="conv")(x)
    h = L.LSTM(64, return_sequences=True, name="lstm")(h)
    yield save(keras.Model(x, L.Dense(3, name="dense")(h), name="conv_lstm"), "conv_lstm")
    if MYCROFT.exists():
        yield "mycroft", str(MYCROFT), 13


def timed(fn, repeat):
    fn()
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        y = fn()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts)), y


def aoti(name, src, pt2, xt, y_k, t_ort, t_pt2, repeat, d):
    """The AOTInductor route for one model (see the module docstring): a table row."""
    import torch

    import rnnconvert
    from rnnconvert.formats.keras import keras_whole
    from rnnconvert.whole.formats.torch import pt2_write

    try:  # the .pt2 as written: a dynamic batch and time
        torch._inductor.aoti_compile_and_package(torch.export.load(pt2), package_path=os.path.join(d, "dyn.pt2"))
        dyn = "compiles"
    except Exception as exc:  # noqa: BLE001 - recorded, not fatal
        dyn = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:80]}"
    t0 = time.perf_counter()
    with torch.no_grad():
        ckpt = rnnconvert.load(src)
        graph = pt2_write.graph_of(ckpt, keras_whole.read_full_model(ckpt), False)
        ep = torch.export.export(pt2_write.build_module(graph).eval(), (xt,))  # static (2, steps, features)
    t_exp = time.perf_counter() - t0
    t0 = time.perf_counter()
    pkg = torch._inductor.aoti_compile_and_package(ep, package_path=os.path.join(d, f"{name}_aoti.pt2"))
    t_comp = time.perf_counter() - t0
    m = torch._inductor.aoti_load_package(pkg)
    with torch.no_grad():
        t, y = timed(lambda: m(xt)[0].numpy(), repeat)
    err = float(np.abs(np.asarray(y, np.float64) - y_k).max()) if np.shape(y) == np.shape(y_k) else float("nan")
    return (f"| {name} AOTInductor (static {tuple(xt.shape)}) | {t_ort * 1e3:.0f} ms | {t * 1e3:.0f} ms | "
            f"{t / t_ort:.2f}x ort, {t / t_pt2:.2f}x .pt2 | compile {t_comp:.0f} s (+ re-export {t_exp:.0f} s) | "
            f"max err {err:.1e} | dynamic .pt2: {dyn} |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--aoti", action="store_true", help="also AOTInductor-compile the GRU models' programs")
    ap.add_argument("--only", nargs="*", default=None, help="model names to run (default: all)")
    a = ap.parse_args()
    import onnxruntime as ort
    import torch

    import rnnconvert
    from rnnconvert.formats.keras import keras_whole
    from rnnconvert.whole.runtimes import torch_export

    torch.set_num_threads(a.threads)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = a.threads
    opts.inter_op_num_threads = 1
    d = tempfile.mkdtemp()
    print(f"torch {torch.__version__}, onnxruntime {ort.__version__}, {a.threads} thread(s), batch 2 x "
          f"{a.steps} steps, median of {a.repeat}")
    print("| model | onnxruntime | .pt2 | emitted module | tf_keras | .pt2 / ort | module / ort | max err .pt2 |")
    print("|---|---|---|---|---|---|---|---|")
    aoti_rows = []
    for name, src, feats in models(d):
        if a.only and name not in a.only:
            continue
        x = np.random.default_rng(1).standard_normal((2, a.steps, feats)).astype(np.float32)
        if name.startswith("bigru"):
            x[0, a.steps - a.steps // 5:] = 0.0  # end padding (Masking(0.0))
            x[1, a.steps // 3:a.steps // 3 + 50] = 0.0  # a gap inside
        onx, pt2, py = (os.path.join(d, f"{name}.{e}") for e in ("onnx", "pt2", "py"))
        t0 = time.perf_counter()
        rnnconvert.convert(src, onx, verify=None, force=True)
        rnnconvert.convert(src, pt2, verify=None, force=True, emit_module=py)
        conv = time.perf_counter() - t0
        full = keras_whole.read_full_model(rnnconvert.load(src))
        km = keras_whole.source_model(src, full.config)  # Keras 2.1's GRU config (reset-before) rebuilt as it was
        s = ort.InferenceSession(onx, opts, providers=["CPUExecutionProvider"])
        iname = s.get_inputs()[0].name
        prog = torch.export.load(pt2).module()
        mod = torch_export.load_module(py, py[:-3] + "_state.pt")
        xt = torch.from_numpy(x)
        with torch.no_grad():
            try:
                t_ort, y_ort = timed(lambda: s.run(None, {iname: x})[0], a.repeat)
            except Exception as exc:  # noqa: BLE001 - the .onnx of a declared length runs that length only
                print(f"<!-- {name}: onnxruntime: {str(exc).splitlines()[0][:120]} -->")
                t_ort, y_ort = float("nan"), np.full_like(x[:, :1, :1], np.nan)
            t_pt2, y_pt2 = timed(lambda: prog(xt)[0].numpy(), a.repeat)
            t_mod, y_mod = timed(lambda: mod(xt).numpy(), a.repeat)
        try:
            t_k, y_k = timed(lambda: km.predict_on_batch(x), max(1, a.repeat // 2))
        except ValueError as exc:  # a declared time length (Mycroft's 29): tf_keras refuses other lengths
            print(f"<!-- {name}: tf_keras: {str(exc).strip().splitlines()[-1].strip()[:160]} -->")
            t_k, y_k = float("nan"), np.full_like(x[:, :1, :1], np.nan)
        err = {k: float(np.abs(np.asarray(v, np.float64) - y_k).max()) if np.shape(v) == np.shape(y_k) else np.nan
               for k, v in (("ort", y_ort), ("pt2", y_pt2), ("mod", y_mod))}
        print(f"| {name} | {t_ort * 1e3:.0f} ms | {t_pt2 * 1e3:.0f} ms | {t_mod * 1e3:.0f} ms | {t_k * 1e3:.0f} ms | "
              f"{t_pt2 / t_ort:.2f}x | {t_mod / t_ort:.2f}x | {err['pt2']:.1e} (ort {err['ort']:.1e}, module "
              f"{err['mod']:.1e}) |  <!-- conversions {conv:.1f} s -->", flush=True)
        if a.aoti and name.startswith("bigru"):
            aoti_rows.append(aoti(name, src, pt2, xt, y_k, t_ort, t_pt2, a.repeat, d))
    for row in aoti_rows:
        print(row)
    # torch's own GRU on the same shapes (no mask, no Keras cell): what an nn.GRU-based form could reach at best
    gru = torch.nn.GRU(10, 64, batch_first=True, bidirectional=True).eval()
    xg = torch.randn(2, a.steps, 10)
    with torch.no_grad():
        t_gru, _ = timed(lambda: gru(xg), a.repeat)
    print(f"nn.GRU(10, 64, bidirectional) alone, (2, {a.steps}, 10): {t_gru * 1e3:.0f} ms")


if __name__ == "__main__":
    main()
