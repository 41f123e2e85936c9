#!/usr/bin/env python
"""Issue #41: graph size and onnxruntime time of a real-sized masked model: Embedding(20000,128,mask_zero) + BiGRU(256) +
GRU(256), batch 32, 200 steps; mask_layout end (the sequence_lens-only graph) against any (the general form), post- and front-padded inputs, each
against tf_keras; onnxruntime on one thread. Run: .venv/bin/python bench/bench_masks.py"""
import os, sys, time, tempfile
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1"); os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
import numpy as np
import tf_keras as keras
L = keras.layers
d = tempfile.mkdtemp()
m = keras.Sequential([keras.Input((None,), dtype="int32", name="tokens"), L.Embedding(20000, 128, mask_zero=True, name="emb"),
                      L.Bidirectional(L.GRU(256, return_sequences=True), name="bigru"), L.GRU(256, name="gru"),
                      L.Dense(5, activation="softmax", name="head")], name="bench")
path = os.path.join(d, "m.h5"); m.save(path, save_format="h5")
rng = np.random.default_rng(0)
x = rng.integers(1, 20000, size=(32, 200)).astype(np.int32)
lens = rng.integers(20, 201, size=32)
xpre = x.copy(); xpost = x.copy()
for b, n in enumerate(lens):
    xpre[b, :200 - n] = 0; xpost[b, n:] = 0
t0 = time.perf_counter(); ref_pre = m(xpre).numpy(); ref_post = m(xpost).numpy(); tk = (time.perf_counter() - t0) / 2
import rnnconvert, onnxruntime as ort
from rnnconvert.whole.conventions import keras_graph
from rnnconvert.formats.keras import keras_whole
from rnnconvert.whole.formats.onnx import model_write
ck = rnnconvert.load(path); full = keras_whole.read_full_model(ck); g = keras_graph.build(full.config, full.weights, ck)
opts = ort.SessionOptions(); opts.intra_op_num_threads = 1; opts.inter_op_num_threads = 1
print(f"tf_keras predict: {tk*1000:.0f} ms per call")
for lay in ("end", "any"):
    mod = model_write.build(g, mask_layout=lay)
    s = ort.InferenceSession(mod.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    for nm, xx, ref in (("post", xpost, ref_post), ("pre", xpre, ref_pre)):
        s.run(["output_0"], {"tokens": xx})
        ts = []
        for _ in range(9):
            t0 = time.perf_counter(); (y,) = s.run(["output_0"], {"tokens": xx}); ts.append(time.perf_counter() - t0)
        print(f"layout={lay} nodes={len(mod.graph.node)} input={nm}-padded: median {np.median(ts)*1000:.1f} ms "
              f"(min {min(ts)*1000:.1f}), max|err| vs tf_keras {np.abs(y - ref).max():.2e}")
