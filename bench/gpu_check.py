"""Check rnnconvert's cuDNN buffer layout against real cuDNN; print a markdown report to stdout.

    PYTHONPATH=$PWD .venv/bin/python bench/gpu_check.py > report.md

On a machine without CUDA it prints a report saying so and exits 0. Checks (see docs/gpu-validation.md):
1. region offsets from ``torch._cudnn_rnn_flatten_weight`` (via ``flatten_parameters``) against
   ``rnnconvert.core.cudnn.layout`` for a grid of specs (float32 and float16);
2. cuDNN forward of ``nn.LSTM/GRU/RNN`` loaded from ``unpack(pack(layer))`` against ``reference.forward``;
3. cuDNN forward of our packed buffer handed to ``torch._cudnn_rnn`` against ``reference.forward``;
4. variable-length (right-padded) batches through ``pack_padded_sequence`` against the reference per sequence;
5. a second caller of cuDNN: JAX ``jax.experimental.rnn.lstm`` given ``pack(layer)`` (full and ragged lengths);
6. the accuracy of cuDNN's ``tanh`` and ``sigmoid`` inside its RNN kernels, over every float32 and float16
   input in [2^-26, 10] and its negative (what ``rnnconvert.verify.cuda`` declares as ``act_ulps``).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # JAX beside torch on one GPU
os.environ["RNNCONVERT_CUDA_TESTS"] = "1"  # tests/conftest.py (imported through test_cudnn) keeps the GPU visible

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "formats" / "cudnn_buffers"))  # test_cudnn

from rnnconvert.speed.kernels import FAST
from rnnconvert.verify import cudnn_layout as cudnn_check
from rnnconvert.core import cudnn, reference  # noqa: E402
from rnnconvert.core.model import Cell  # noqa: E402


def main() -> int:
    print("# cuDNN layout check\n")
    if not cudnn_check.cuda_available():
        print("No CUDA device with cuDNN is visible to torch: nothing was checked.")
        return 0
    import torch

    from test_cudnn import CUDA_GRID, random_layer  # the same grid and weights as the cuda tests

    v = cudnn_check.versions()
    print("| item | value |\n|---|---|")
    for k, val in v.items():
        print(f"| {k} | {val} |")
    failures = 0
    print("\n## Region offsets (layout() vs cuDNN via torch._cudnn_rnn_flatten_weight)\n")
    print("| spec | dtype | result |\n|---|---|---|")
    for spec in CUDA_GRID:
        for dt in (torch.float32, torch.float16):
            try:
                bad = cudnn_check.compare_offsets(spec, dt)
            except Exception as exc:  # report, do not stop
                bad = [f"error: {exc!r}"]
            failures += bool(bad)
            print(f"| {spec} | {dt} | {'ok' if not bad else '; '.join(bad[:4])} |")
    print("\n## Forward: cuDNN vs numpy reference (float32, TF32 off)\n")
    print("| spec | route | max abs err | max rel err | time (s) |\n|---|---|---|---|---|")
    for spec in CUDA_GRID:
        layer = random_layer(spec, seed=3)
        x = np.random.default_rng(4).normal(size=(2, 6, spec.input_size)).astype(np.float32)
        ref = reference.forward(layer, x, kernels=FAST)
        for route, fn in (("module", cudnn_check.forward_module), ("buffer", cudnn_check.forward_buffer)):
            t0 = time.perf_counter()
            try:
                y = fn(layer, x)
                err = float(np.max(np.abs(y - ref)))
                rel = float(np.max(np.abs(y - ref) / (np.abs(ref) + 1e-6)))
                ok = np.allclose(y, ref, atol=2e-5, rtol=1e-4)
                cell = f"{err:.2e} | {rel:.2e}" + ("" if ok else " FAIL")
            except Exception as exc:
                ok, cell = False, f"error: {exc!r} | -"
            failures += not ok
            print(f"| {spec} | {route} | {cell} | {time.perf_counter() - t0:.3f} |")
    failures += variable_length(CUDA_GRID, random_layer)
    failures += jax_cudnn([s for s in CUDA_GRID if s.cell is Cell.LSTM and not s.proj_size], random_layer)
    activation_accuracy()
    print(f"\n**{failures} failing checks.**")
    return 1 if failures else 0


def _ragged(layer, x, lengths, run) -> tuple[float, bool]:
    """Max error of ``run(layer, x, lengths)`` (right-padded batch) against the numpy reference run on each
    sequence cut to its length (the reverse direction then starts at its last real step)."""
    y = run(layer, x, lengths)
    err = 0.0
    for b, n in enumerate(lengths):
        ref = reference.forward(layer, x[b:b + 1, :n], kernels=FAST)
        err = max(err, float(np.max(np.abs(y[b:b + 1, :n] - ref))))
    return err, err <= 2e-5 + 1e-4


def _ragged_rows(grid, random_layer, run, length_sets, seed: int) -> int:
    """One table row per spec of ``grid`` and lengths of ``length_sets`` (:func:`_ragged` of ``run``); the failures."""
    bad = 0
    for spec in grid:
        layer = random_layer(spec, seed=seed)
        for lengths in length_sets:
            x = np.random.default_rng(seed + 1).normal(size=(len(lengths), 6, spec.input_size)).astype(np.float32)
            try:
                err, ok = _ragged(layer, x, lengths, run)
                cell = f"{err:.2e} | {'ok' if ok else 'FAIL'}"
            except Exception as exc:  # report, do not stop
                ok, cell = False, f"- | error: {str(exc)[:200]!r}"
            bad += not ok
            print(f"| {spec} | {lengths} | {cell} |")
    return bad


def variable_length(grid, random_layer) -> int:
    """cuDNN on right-padded batches of different lengths (``pack_padded_sequence``), module route."""
    import torch

    print("\n## Variable-length batches: torch pack_padded_sequence through cuDNN vs the numpy reference per sequence\n")
    print("| spec | lengths | max abs err | result |\n|---|---|---|---|")

    def run(layer, x, lengths):
        m = cudnn_check.module_of(layer)
        xt = torch.from_numpy(np.ascontiguousarray(x)).cuda()
        packed = torch.nn.utils.rnn.pack_padded_sequence(xt, torch.tensor(lengths), batch_first=True,
                                                         enforce_sorted=False)
        with torch.no_grad():
            y, _ = m(packed)
        y, _ = torch.nn.utils.rnn.pad_packed_sequence(y, batch_first=True, total_length=x.shape[1])
        return y.float().cpu().numpy()

    return _ragged_rows(grid, random_layer, run, [[6, 2, 5, 1]], seed=5)


def jax_cudnn(grid, random_layer) -> int:
    """A second caller of cuDNN: JAX's ``jax.experimental.rnn.lstm`` (cuDNN v8 API, ``jaxlib/gpu/rnn_kernels.cc``)
    given OUR ``pack(layer)`` as its weight buffer, float32 (``precision=HIGHEST``: no TF32), full and ragged
    ``seq_lengths``, against the numpy reference."""
    print("\n## JAX jax.experimental.rnn.lstm (cuDNN) given pack(layer), vs the numpy reference\n")
    try:
        import jax
        import jax.numpy as jnp
        from jax.experimental import rnn
    except ImportError as exc:
        print(f"JAX is not importable here ({exc}): not checked.")
        return 0
    print(f"jax {jax.__version__}, devices {jax.devices()}\n")
    print("| spec | lengths | max abs err | result |\n|---|---|---|---|")

    def run(layer, x, lengths):
        spec = cudnn.Spec.of(layer)
        n = spec.num_layers * spec.dirs
        B, H = x.shape[0], spec.hidden_size
        zeros = jnp.zeros((n, B, H), jnp.float32)
        y, _, _ = rnn.lstm(jnp.asarray(x), zeros, zeros, jnp.asarray(cudnn.pack(layer)),
                           jnp.asarray(lengths, jnp.int32), spec.input_size, H, spec.num_layers, 0.0,
                           spec.bidirectional, precision=jax.lax.Precision.HIGHEST)
        return np.asarray(y)

    return _ragged_rows(grid, random_layer, run, [[6, 6, 6, 6], [6, 2, 5, 1]], seed=7)


def _floats(lo_exp: int, hi: float, dtype) -> np.ndarray:
    """Every positive value of ``dtype`` from ``2**lo_exp`` to ``hi`` (float32: by bit pattern)."""
    import torch

    if dtype == torch.float16:
        v = np.arange(0, 0x7C00, dtype=np.uint16).view(np.float16).astype(np.float64)
        return v[(v >= 2.0 ** lo_exp) & (v <= hi)]
    lo = np.array(2.0 ** lo_exp, np.float32).view(np.uint32)
    top = np.array(hi, np.float32).view(np.uint32)
    return np.arange(lo, top + 1, dtype=np.uint32)


def activation_accuracy() -> None:
    """The accuracy of cuDNN's own ``tanh`` and ``sigmoid``, over every float32 (float16) input in
    ``[2**-26, 10]`` and its negative, inside the RNN kernels themselves: an RNN_TANH layer with ``W_ih = I``,
    ``W_hh = 0``, no bias, one step (``h = tanh x``); LSTM one step with gates pinned by +-30 biases: ``c = tanh x``
    (g gate), ``c = sigmoid x`` (f gate, ``c0 = 1``), ``h = tanh c0`` (``c0 = x``); GRU ``h = tanh x`` (n gate).
    In units of ``u (1 + |a|)`` (``u`` of the dtype); the exact values in float64 on the GPU."""
    import torch

    print("\n## Activation accuracy inside cuDNN's RNN kernels (every input value in [2^-26, 10], both signs)\n")
    print("| dtype | H | kernel / function | max error in u(1+|a|) | at input |\n|---|---|---|---|---|")
    for dt in (torch.float32, torch.float16):
        u = 2.0 ** -24 if dt == torch.float32 else 2.0 ** -11
        pos = _floats(-26 if dt == torch.float32 else -14, 10.0, dt)
        for H in (4, 32, 64, 128, 256, 512, 1024, 2048):
            results: dict = {}

            def note(runs, xs, suffix=""):
                for name, got, exact in runs:
                    a = exact.double()
                    err = ((got.double() - a).abs() / (u * (1 + a.abs()))).flatten()
                    j = int(err.argmax())
                    e = float(err[j])
                    if e >= results.get(name + suffix, (-1.0, 0.0))[0]:
                        results[name + suffix] = (e, float(xs.reshape(-1)[j]))
            chunk = min(1 << 24, H << 16) // H * H  # at most 65536 rows a call
            for sign in (1.0, -1.0):
                for at in range(0, len(pos), chunk):
                    part = pos[at:at + chunk]
                    if dt == torch.float32:
                        xs = torch.from_numpy(part.view(np.float32).astype(np.float32)).cuda()
                    else:
                        xs = torch.from_numpy(part).cuda().to(torch.float16)
                    pad = (-len(xs)) % H
                    xs = torch.cat([xs, xs[:1].expand(pad)]) * sign if pad else xs * sign  # pad: repeat a value
                    note(_activation_runs(xs.view(-1, H), H, dt), xs)
            # the batch verification uses (a few dozen rows) may run other kernels: 8 rows, inputs drawn
            # from the same values, 200 calls
            rng = np.random.default_rng(H)
            for _ in range(200):
                idx = rng.integers(0, len(pos), 8 * H)
                if dt == torch.float32:
                    xs = torch.from_numpy(pos[idx].view(np.float32).astype(np.float32)).cuda()
                else:
                    xs = torch.from_numpy(pos[idx]).cuda().to(torch.float16)
                xs = xs * torch.from_numpy(rng.choice([-1.0, 1.0], len(idx)).astype(np.float32)).cuda().to(dt)
                note(_activation_runs(xs.view(8, H), H, dt), xs, ", batch 8")
            for name, (e, x) in sorted(results.items()):
                print(f"| {str(dt).replace('torch.', '')} | {H} | {name} | {e:.1f} | {x:.8g} |")


def _activation_runs(x, H: int, dt):
    """``(name, cuDNN's value, the exact value)`` of each pinned one-step run on inputs ``x`` ``(N, H)``."""
    import torch

    eye, N = torch.eye(H, device="cuda", dtype=dt), x.shape[0]
    out = []
    with torch.no_grad():
        m = torch.nn.RNN(H, H, batch_first=True).cuda().to(dt)
        m.weight_ih_l0.copy_(eye)
        m.weight_hh_l0.zero_(); m.bias_ih_l0.zero_(); m.bias_hh_l0.zero_()  # noqa: E702
        out.append(("RNN_TANH tanh(x)", m(x[:, None])[0][:, 0], torch.tanh(x.double())))
        lstm = torch.nn.LSTM(H, H, batch_first=True).cuda().to(dt)
        lstm.weight_hh_l0.zero_(); lstm.bias_hh_l0.zero_()  # noqa: E702
        z = torch.zeros(1, N, H, device="cuda", dtype=dt)
        for name, gate, pins, c0 in (("LSTM g gate tanh(x)", 2, (30, -30, None, 30), z),
                                     ("LSTM f gate sigmoid(x)", 1, (-30, None, 0, 30), z + 1)):
            w = torch.zeros(4 * H, H, device="cuda", dtype=dt)
            w[gate * H:(gate + 1) * H] = eye
            b = torch.zeros(4 * H, device="cuda", dtype=dt)
            for k, v in enumerate(pins):
                if v is not None:
                    b[k * H:(k + 1) * H] = v
            lstm.weight_ih_l0.copy_(w); lstm.bias_ih_l0.copy_(b)  # noqa: E702
            c = lstm(x[:, None], (z, c0))[1][1][0]
            exact = torch.tanh(x.double()) if gate == 2 else torch.sigmoid(x.double())
            out.append((name, c, exact))
        lstm.weight_ih_l0.zero_()
        b = torch.zeros(4 * H, device="cuda", dtype=dt)
        b[:H], b[H:2 * H], b[3 * H:] = -30, 30, 30  # i = 0, f = 1, o = 1: c = c0, h = tanh(c0)
        lstm.bias_ih_l0.copy_(b)
        h = lstm(x[:, None], (z, x[None]))[1][0][0]
        out.append(("LSTM cell tanh(c)", h, torch.tanh(x.double())))
        gru = torch.nn.GRU(H, H, batch_first=True).cuda().to(dt)
        w = torch.zeros(3 * H, H, device="cuda", dtype=dt)
        w[2 * H:] = eye
        b = torch.zeros(3 * H, device="cuda", dtype=dt)
        b[H:2 * H] = -30  # z = 0: h = n = tanh(x) (h0 = 0)
        gru.weight_ih_l0.copy_(w); gru.bias_ih_l0.copy_(b)  # noqa: E702
        gru.weight_hh_l0.zero_(); gru.bias_hh_l0.zero_()  # noqa: E702
        out.append(("GRU n gate tanh(x)", gru(x[:, None])[0][:, 0], torch.tanh(x.double())))
    return out


if __name__ == "__main__":
    sys.exit(main())
