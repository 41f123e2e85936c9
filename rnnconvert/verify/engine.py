"""Check that a written file computes the same function as its source.

Two comparisons per recurrent layer, both must pass (docs/cli.md "Verification" has the rule and its proof):

1. **One step from the source's own states** (the decisive check, any sequence length). The source runs
   along its own trajectory (the canonical numpy reference, :func:`rnnconvert.core.reference.trajectory`, in
   float32, the weights' precision; for a one-slab layer of a format with its own equations, Keras HDF5 and
   TF2, the float32 run of those equations that the sequence comparison makes anyway: ``source_forward_multi``
   records its states), which gives the state ``h_{t-1}`` (and ``c_{t-1}``) before every step
   ``t`` of every sequence, stacked layer and direction. The *target framework* then computes one step
   from each of those ``B*T`` (input, state) pairs, all in one batched call: sequences of length 1 with
   initial states (torch ``h0, c0``; onnxruntime ``initial_h``/``initial_c``; Keras ``initial_state`` /
   the layer's cell; ``target_step`` of the target format module). The same steps are computed exactly
   (float64, :func:`rnnconvert.core.reference.step`), and each element of ``h_t`` (and ``c_t``) must agree
   within :func:`rnnconvert.verify.bounds.step_bound`: a forward error bound of one step evaluated in
   float32 (unit roundoff ``u``; float16 ``u`` for float16 weights or ``--dtype float16``), a few
   roundings of the step's own magnitudes. Errors cannot compound: each step starts from exactly the
   same numbers on both sides, so the tolerance does not grow with the sequence length. States built from
   the weights are appended where the trajectory and the probes leave a gate unit unresponsive
   (:mod:`rnnconvert.verify.states`), and the layer's resolution (the smallest change of a weight, bias or
   row the states catch) is recorded on its :class:`LayerCheck`.
2. **A short full-sequence run** (the first :data:`SEQ_STEPS` steps of the batch) for what one step
   cannot show: direction and ``go_backwards``, the order of stacked layers and directions, the link of
   the written file to the *source's own equations* (``source_forward`` of Keras and TF1 files, or the
   source framework with ``mode='framework'``). Tolerance ``first * max(1, max|y64|) + 2 * max|y64 - y32|``
   (source side in float64 and float32; ``first = 1e-5``, ``1e-2`` for float16), the second term widened to
   the spread of an emulation of the target's arithmetic for a target that declares one
   (:func:`sequence_tolerance`). A stacked layer the numpy
   reference runs into a target that runs one slab alone is compared slab by slab, each slab of the target
   from the source's float32 input of that slab (:meth:`StreamedVerification._by_slab`).

Verdicts (:attr:`LayerCheck.verdict`; docs/cli.md "Verdicts" has every rule): ``'fail'`` when either comparison
exceeds its tolerance; ``'inconclusive'`` also for a gate unit no state exercises, a weight no state reaches, and
a sequence above its float32 estimate by more than :data:`rnnconvert.verify.orders.FAR` times the spread measured
over several float32 evaluation orders;
``'inconclusive'`` when it passes but a tolerance is too loose to tell a broken file from a correct one:
above :func:`fraction` of the output's own scale (``max|y|``; at most 1 for sigmoid/tanh cells), which an
ill-conditioned layer on long or large inputs can reach; ``'ok'`` otherwise. An inconclusive layer is
never reported as ok: the CLI exits with :class:`~rnnconvert.errors.InconclusiveError`'s code and a
conversion keeps no output unless ``accept_inconclusive`` (``--accept-inconclusive``).

Engines: the report names both (:attr:`LayerCheck.source_route`, :attr:`LayerCheck.target_route`). A
target format whose framework is not installed (or that has no ``target_step``) falls back to the numpy
reference on the arrays read back from the written file, and the route says so.

Streamed and eager conversions share :class:`StreamedVerification`: the source side runs slab by slab
while each slab of parameters is in memory (trajectory, exact steps and their bounds, the short sequence
in float32 and float64: the source is never read twice); the target side reads the written file back one
layer or slab at a time. Memory: the kept states are ``B*T*(I + 3*dirs*H)`` numbers per slab.
"""

from __future__ import annotations

import functools
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ..core import reference
from ..speed import gpu, kernels
from ..speed.kernels import FAST
from . import bounds, escapes, orders, states
from ..core.model import Checkpoint, RNNLayer
from ..errors import DependencyError, FormatError, InconclusiveError, VerificationError
from .checks import LayerCheck
from . import source
from .raw import raw_tensors
from .target import as_source, as_target

#: unit roundoff of the accumulation assumed by the one-step bound: float32's (float16 weights are stored
#: and rounded in float16 but summed in float32 by torch's CPU kernels and cuDNN's float compute type)
U_ACC = 2.0 ** -24
#: the full-sequence comparison uses the first this-many steps of each layer's batch
SEQ_STEPS = 8
#: the trajectory states :func:`rnnconvert.verify.escapes.swap_escapes` uses besides the probes (its cost, 24
#: elementwise evaluations of the step per LSTM direction, is linear in the states; the probes do most of the
#: work: their bound is a few ``u``)
SWAP_STATES = 2
#: the largest layer (bytes of parameters) a streamed conversion reads again to rule out the slips only a
#: sequence shows (:meth:`StreamedVerification._sequence_escapes`), in the rare case that needs it
SEQ_SLIP_BYTES = 64 << 20


def fraction(u: float) -> float:
    """The largest tolerance, as a fraction of the output's scale, at which a comparison still decides:
    ``max(1e-2, 64 u)`` (float32: 1e-2; float16 targets: 3.1e-2). A layout slip (a swapped gate block, a
    reversed direction, a dropped bias) moves outputs by a sizeable part of their scale; a tolerance above
    this could hide it. (The one-step bound is elementwise: where the largest element reaches this, most
    are far smaller, and the mutation tests measure what it still detects.)"""
    return max(1e-2, 64.0 * u)


@dataclass
class VerifyReport:
    """Per-layer checks plus the batch used and the time spent."""

    layers: list[LayerCheck] = field(default_factory=list)
    batch: int = 0
    steps: int = 0
    seed: int = 0
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.layers)

    @property
    def failed(self) -> bool:
        return any(c.failed for c in self.layers)

    @property
    def inconclusive(self) -> bool:
        return not self.failed and any(c.verdict == "inconclusive" for c in self.layers)

    @property
    def verdict(self) -> str:
        return "fail" if self.failed else "inconclusive" if self.inconclusive else "ok"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for c, lc in zip(d["layers"], self.layers):
            c["ok"] = lc.ok
        d["ok"] = self.ok
        d["verdict"] = self.verdict
        return d

    def raise_if_failed(self, accept_inconclusive: bool = False) -> None:
        """Raise :class:`VerificationError` naming the worst layer when a layer failed, and
        :class:`InconclusiveError` when a layer is inconclusive (unless ``accept_inconclusive``)."""
        bad = [c for c in self.layers if c.failed]
        if bad:
            c = max(bad, key=lambda c: c.max_abs_err / max(c.tolerance, 1e-300))
            raise VerificationError(
                f"verification failed: layer '{c.name}': {c.reason}; the output was not written. "
                f"Please report this with the file")
        unsure = [c for c in self.layers if c.verdict == "inconclusive"]
        if unsure and not accept_inconclusive:
            c = unsure[0]
            raise InconclusiveError(
                f"verification inconclusive: layer '{c.name}': {c.reason}; the output was not written "
                f"(--accept-inconclusive keeps it; a shorter or smaller-range --inputs may decide)")


#: The verification batch ``(sequences, steps)``: 3 random sequences of 8 steps ...
SAMPLE = (3, 8)
#: ... and for a checkpoint with at least :data:`LARGE_BYTES` of recurrent parameters, 4 sequences of 2
#: steps. Verification's cost is linear in the number of states (each is a column of every product with every
#: weight matrix: the float64 one-step products and bounds on the source side, the target framework's one
#: step) and in the number of steps (each step of the trajectory, of the source's own equations and of the
#: target's sequence reads every ``W_hh`` once more), so a multi-GB model's verification is compute-bound in
#: both (issue #18: 27 columns, 16 pseudo-layers of 50 M weights, 60 s of a 2-core machine; 2 x 4 steps -> 4 x
#: 2: 13.1-13.3 s -> 11.3-12.2 s for the whole 3 GB conversion). 8 states from the trajectory (4 of them
#: nonzero: every ``W_hh`` entry meets a nonzero state at step 2) plus the 3 probes
#: (:func:`rnnconvert.core.escapes.probe_rows`) still test every weight of the step, tell the directions and
#: ``go_backwards`` apart (two steps, not one: the mutation tests run on this sample too,
#: tests/verify/test_verify_mutations.py), and show every gate-block swap where the bound is loose
#: (:func:`rnnconvert.verify.escapes.swap_escapes`).
SAMPLE_LARGE = (4, 2)
LARGE_BYTES = 256 << 20


def sample_shape(ckpt: Checkpoint) -> tuple[int, int]:
    """``(batch, steps)`` of the verification batch for ``ckpt`` (:data:`SAMPLE`, :data:`SAMPLE_LARGE`);
    placeholders of a lazy checkpoint count at their declared size."""
    nbytes = sum(int(a.size) * a.dtype.itemsize for layer in ckpt.layers for dirs in layer.params
                 for dp in dirs for a in dp.arrays().values())
    return SAMPLE_LARGE if nbytes >= LARGE_BYTES else SAMPLE


def _sample(ckpt: Checkpoint, batch: int | None, steps: int | None) -> tuple[int, int]:
    b, t = sample_shape(ckpt)
    return (b if batch is None else batch), (t if steps is None else steps)


def _batches(ckpt: Checkpoint, batch: int, steps: int, seed: int, inputs: dict | None) -> list[np.ndarray]:
    """Each layer's input batch, float32 ``(batch, steps, input_size)``: ``inputs[layer.name]`` when given
    (any batch and steps), else drawn from ``N(0, 1)`` (``default_rng(seed)``, one draw per layer in order,
    drawn whether or not the layer has given inputs, so that a layer's batch does not depend on the others').

    Raises:
        FormatError: a given input is not 3-D with the layer's input size last, or names no layer.
    """
    inputs = dict(inputs or {})
    rng = np.random.default_rng(seed)
    out = []
    for layer in ckpt.layers:
        x = rng.standard_normal((batch, steps, layer.input_size)).astype(np.float32)
        given = inputs.pop(layer.name, None)
        if given is not None:
            given = np.asarray(given)
            if given.ndim != 3 or given.shape[-1] != layer.input_size or given.size == 0:
                raise FormatError(f"verification input for layer '{layer.name}' has shape {given.shape}; "
                                  f"expected (batch, steps, {layer.input_size})")
            x = np.ascontiguousarray(given, dtype=np.float32)
        out.append(x)
    if inputs:
        raise FormatError(f"verification inputs name no recurrent layer: {', '.join(sorted(inputs))} "
                          f"(layers: {', '.join(l.name for l in ckpt.layers)})")
    return out



def _first(layer: RNNLayer, first_tol: float | None) -> float:
    return first_tol or (1e-2 if layer.dtype == np.float16 else 1e-5)


def _one_blas_thread(fn):
    """``fn`` run with numpy's BLAS limited to one thread (``threadpoolctl``): verification multiplies each
    weight matrix block by block (1 MiB blocks, :func:`rnnconvert.speed.kernels.block_rows`) by a few dozen
    states, products too small to share between threads, while the conversion's reader and writer threads
    need the other core; a multithreaded BLAS then spends its time waiting for its threads (measured on
    the 2-core machine, ``docs/performance.md``: 2.3-2.5x the wall time of a verified conversion). The
    products share the cores through :mod:`rnnconvert.speed.parallel` instead. ``RNNCONVERT_BLAS_THREADS=N``
    lets BLAS use ``N`` threads here (a benchmark's knob: ``bench/device_table.py``)."""
    from ..process import settings

    @functools.wraps(fn)
    def run(*args, **kwargs):
        with blas_controller().limit(limits=settings.value("RNNCONVERT_BLAS_THREADS"), user_api="blas"):
            return fn(*args, **kwargs)
    return run


_CONTROLLER: list = []


def blas_controller():
    """One ``threadpoolctl.ThreadpoolController`` for the process (numpy's BLAS), made at the first call,
    which verification makes in the caller's thread before any of its own threads start
    (:class:`StreamedVerification`, :func:`import_engine`). ``threadpool_limits`` would list the process's
    libraries on every call (``dl_iterate_phdr``, holding the dynamic loader's lock while its callback waits
    for the GIL): run beside a thread importing an extension module (holding the GIL while ``dlopen`` waits
    for that lock) the two deadlock; it hung one verified conversion in three with :func:`import_engine`."""
    if not _CONTROLLER:
        from threadpoolctl import ThreadpoolController

        _CONTROLLER.append(ThreadpoolController())
    return _CONTROLLER[0]


def _loose(exact, bound) -> float:
    """The largest element of a one-step bound as a fraction of its output's scale (``h_1``, then ``c_1``):
    what :meth:`StreamedVerification.judge` compares with :func:`fraction` (source side and target side alike)."""
    return max(float(bd.max()) / max(float(np.abs(ev).max()), 1e-300)
               for ev, bd in zip(exact, bound) if ev is not None)


def unit_roundoff(layer: RNNLayer, target_dtype=None) -> float:
    """``u`` of the step bound: float16's ``2**-11`` for float16 weights or a float16 target run, else
    float32's ``2**-24`` (float64 files are run in float32 by onnxruntime; float32 covers them)."""
    f16 = layer.dtype == np.float16 or (target_dtype is not None and np.dtype(target_dtype) == np.float16)
    return bounds.unit_roundoff(np.float16 if f16 else np.float32)


def _unfinished(layer: RNNLayer, x: np.ndarray) -> np.ndarray:
    """``layer`` run on ``x`` in float64 by the numpy reference, its outputs in input time order (no
    :func:`rnnconvert.core.reference.finish`): what :meth:`StreamedVerification._sequence_escapes` compares."""
    y = np.asarray(x, np.float64)
    for k in range(layer.num_layers):
        y = reference.forward_slab(layer, layer.params[k], y, kernels=FAST)
    return y


def sequence_tolerance(y64: np.ndarray, y32: np.ndarray, first: float, spread: float = 0.0) -> float:
    """The full-sequence comparison's tolerance ``first * max(1, max|y64|) + 2 * max(max|y64 - y32|, spread)``:
    the second term is the spread of the source's own float32 and float64 runs over these few steps, or
    ``spread`` where larger: that of a run emulating the target's own arithmetic (``target_arithmetic`` of a
    target that computes less accurately than float32 numpy: cuDNN's ``tanh``, float16 runs)."""
    own = float(np.abs(y64 - np.asarray(y32, np.float64)).max())
    return first * max(1.0, float(np.abs(y64).max())) + 2.0 * max(own, spread)



def _engine(dst_module) -> str:
    """The target side's engine with its version: ``route`` of the format's record, and the version of its
    ``engine`` distribution when installed (``'torch 2.13.0'``)."""
    route = dst_module.route
    dist = dst_module.engine
    if dist:
        from importlib import metadata

        try:
            return f"{route} {metadata.version(dist)}"
        except metadata.PackageNotFoundError:
            return route
    return route


def _worst(err: np.ndarray, bound: np.ndarray) -> tuple[float, float, float, tuple]:
    """``(ratio, err, bound, index)`` at the element of largest ``err / bound`` (NaN counts as infinite)."""
    ratio = np.where(np.isfinite(err), err / bound, np.inf)
    j = np.unravel_index(int(np.argmax(ratio)), ratio.shape)
    return float(ratio[j]), float(err[j]), float(bound[j]), j


#: Target engines imported in a background thread while the conversion runs (:func:`import_engine`): their
#: import does nothing a thread must not (no signal handlers: Python allows those only in the main thread).
#: TensorFlow and Keras are left to the main thread.
BACKGROUND_IMPORT = ("torch", "onnxruntime")


def import_engine(dst_module):
    """Start importing the target's framework (``dst_module.engine``, when in :data:`BACKGROUND_IMPORT` and
    installed) in a daemon thread, so that the target side of verification finds it loaded: ``import
    torch`` is 1.1-2.4 s of the 2-core test machine, a fifth of the verification of a 3 GB model
    (docs/performance.md session 7), and the conversion before it leaves a core idle while it waits on
    the disk. Returns the thread (or None); a later ``import`` in another thread waits for it (Python's
    per-module import lock). An import error is left for the target side to meet and report."""
    import importlib.util
    import sys
    import threading

    name = as_target(dst_module).engine
    if name not in BACKGROUND_IMPORT or name in sys.modules:
        return None
    blas_controller()  # listed now, in this thread: never while the import runs (see blas_controller)
    try:
        if importlib.util.find_spec(name) is None:
            return None
    except (ImportError, ValueError):
        return None

    def run():
        try:
            importlib.import_module(name)
        except BaseException:  # the target side imports it again and reports
            pass
    t = threading.Thread(target=run, name=f"rnnconvert-import-{name}", daemon=True)
    t.start()
    return t


#: Why a comparison ran in the numpy reference on the arrays read back instead of the target framework.
NOT_INSTALLED = "its framework is not installed or failed to import"


class StreamedVerification:
    """Verification in two halves, so that only one slab of parameters is in memory at a time (streamed
    conversions, lazy sources); :func:`verify` runs the same on an in-memory checkpoint.

    * :meth:`source_slab` while slab ``(i, k)`` is loaded (called in order): the trajectory of the slab in
      float32 from its input (the batch, or the previous slab's trajectory output), the exact one-step
      results from every state and their bounds (:func:`rnnconvert.verify.bounds.step_bound`), and the short
      sequence in float32 and float64 (the numpy reference chained over slabs; a layer the source format
      runs with its own equations, ``source_forward`` on the file's tensors (``layer.source['raw']`` read, passed
      as ``raw=``, the layer left as it is), at its last slab -- or, for a one-slab layer whose batch is the
      short sequence, first, its float32 run recording the trajectory (``source_forward_multi(record=)``), which
      the numpy reference then does not run;
      ``mode='framework'``: the source framework). When the short sequence is the whole batch and the numpy
      reference runs it, its float32 run is the trajectory itself, computed once in lockstep with the float64
      run (:func:`rnnconvert.core.reference.trajectory_multi`). Nothing of the source is read again later.
    * :meth:`target_side` after the writer closed: the target framework on the written file, per layer,
      per slab (``target_forward_slab``) for stacked layers when the format offers it, and one step per
      slab (``target_step``).
    """

    def __init__(self, src_ckpt: Checkpoint, src_module, *, mode: str = "reference", src_path=None,
                 seed: int = 0, batch: int | None = None, steps: int | None = None,
                 inputs: dict[str, np.ndarray] | None = None, first_tol: float | None = None,
                 target_dtype=None, target=None) -> None:
        batch, steps = _sample(src_ckpt, batch, steps)
        blas_controller()  # in the caller's thread, before the verifier thread and any background import
        src_module, target = as_source(src_module), as_target(target)
        self.ckpt, self.src_module, self.mode, self.src_path = src_ckpt, src_module, mode, src_path
        self.first_tol, self.target_dtype = first_tol, target_dtype
        #: whether the target format (``target``: the module the written file is judged with) runs one slab alone
        self.slab_targets = getattr(target, "target_forward_slab", None) is not None
        #: the accuracy of the target's activations in ulps, where it declares one (cuDNN's float32 ``tanh``:
        #: :attr:`rnnconvert.verify.cuda.CudaTarget.act_ulps`); None: :data:`rnnconvert.verify.bounds.ACT_ULPS`
        self.act_ulps = getattr(target, "act_ulps", None)
        #: an emulation of the target's own arithmetic (``target_arithmetic``: the cuDNN routes), run on each slab
        #: while it is loaded (:meth:`_emulate`), so that a streamed source needs no second read
        self.emulate = getattr(target, "target_arithmetic", None)
        self.rep = VerifyReport(batch=batch, steps=steps, seed=seed)
        self.x = _batches(src_ckpt, batch, steps, seed, inputs)
        n = len(src_ckpt.layers)
        self.y32: list = [None] * n  # the short sequence, source side, float32 ...
        self.y64: list = [None] * n  # ... and float64
        self.yfw: list = [None] * n  # the source framework's outputs (mode='framework')
        self.traj: list = [None] * n  # the float32 trajectory output of the last slab done (next slab's input)
        self.slabs: list = [[None] * layer.num_layers for layer in src_ckpt.layers]
        #: per stacked layer compared slab by slab (:meth:`_by_slab`), per slab: ``(x, y32, y64)``, the slab's
        #: float32 input (the previous slab's float32 output) and its float32 and float64 runs from it
        self.seq_slabs: list = [[None] * layer.num_layers for layer in src_ckpt.layers]
        self.routes = [""] * n
        #: per layer, the spread of the emulated target run from the float64 run (:meth:`_emulate`): one number
        #: for the whole layer, or a list of one per slab for a layer compared slab by slab
        self.spreads: list = [None] * n
        self._em: list = [None] * n  # the emulated run and the canonical float64 run chained over slabs
        self.target_seconds = 0.0
        #: per layer, ``(slab, direction, swap_escapes(...))`` of the directions whose bound is loose
        self.escapes: list[list] = [[] for _ in range(n)]
        #: per layer, ``(slab, direction, states, constructed, unexercised gate rows)`` of the one-step states
        #: (:meth:`_exercise`, :mod:`rnnconvert.verify.states`)
        self.coverage: list[list] = [[] for _ in range(n)]
        self.seconds = 0.0
        self.pool: dict = {}  # the source's raw tensors of the last layer, reused (_raw_tensors)
        self._back = None  # the written file read back (fallback target of the one-step check)
        self._steps: dict = {}  # (layer name, slab) -> the target's one steps, from a target_slab_check run

    def _seq_x(self, i: int) -> np.ndarray:
        return self.x[i][:, :SEQ_STEPS]

    def _by_slab(self, layer: RNNLayer) -> bool:
        """Whether the short sequence of ``layer`` is compared slab by slab: a stacked layer the numpy reference
        runs (not the source's own equations or framework) into a target that runs one slab alone
        (``slab_targets``: its format's ``target_forward_slab``). Each slab of the target then starts from the
        source's own float32 input of that slab, as each one step starts from the source's own state, so that
        rounding does not compound through the stack: a float16 target rounds every slab's output to float16,
        and the 8-slab float16 benchmark LSTM amplified that to 0.0126 at one element of its output after 8
        slabs (a tolerance of 0.01: a correct file failed; docs/performance.md, session 8)."""
        return (self.slab_targets and layer.num_layers > 1 and self.mode != "framework"
                and not source.own_equations(self.src_module, layer))

    def _own_run(self, i: int, record: list[dict] | None = None) -> list[dict] | None:
        """The short sequence of layer ``i`` by the source format's own equations on the file's tensors, in
        float32 and float64 (``self.y32``, ``self.y64``); ``record``, returned, filled with the float32 run's
        states where the format records them (``source_slab``)."""
        layer = self.ckpt.layers[i]
        xs = self._seq_x(i)
        raw = raw_tensors(layer, self.pool)
        self.y32[i], self.y64[i] = source.run(self.src_module, layer, [xs.astype(np.float32), xs.astype(np.float64)],
                                           raw, record)
        return record

    @_one_blas_thread
    def source_slab(self, i: int, k: int, dirs: list) -> None:
        """The source side of slab ``k`` of layer ``i`` (called in order, with the slab's loaded params)."""
        t0 = time.perf_counter()
        layer = self.ckpt.layers[i]
        one = layer.one_slab(k, dirs)
        u = unit_roundoff(layer, self.target_dtype)
        xin = self.x[i] if k == 0 else self.traj[i]
        xs = self._seq_x(i)
        own = source.own_equations(self.src_module, layer)
        # The short sequence's batch is the whole batch (steps <= SEQ_STEPS) and the numpy reference runs it:
        # its float32 run IS the trajectory (same inputs, weights, dtype and code), so it is computed once,
        # in lockstep with the float64 run (one read of each weight matrix per step for both).
        shared = not own and xs.shape[1] == xin.shape[1]
        # A one-slab layer run by its own equations on the whole batch: the states of that float32 run are the
        # trajectory (the source's own states; the one-step check starts the target from them), so the numpy
        # reference does not run the same float32 sequence a second time (Keras HDF5 and TF2 sources)
        recs = None
        if own and layer.num_layers == 1 and xs.shape[1] == xin.shape[1] and self.src_module.source_forward_multi:
            recs = self._own_run(i, [{} for _ in dirs])
            y = self.y32[i]
            if not all(recs) or any(r["h"].shape != (*xin.shape[:2], layer.output_size) for r in recs):
                recs = None  # the format did not record them (TF1 cells), or not as the canonical states
        per = self._by_slab(layer)
        if recs is not None:  # the trajectory is the source's own float32 run (above)
            pass
        elif shared:
            x64 = xs.astype(np.float64) if k == 0 else np.asarray(xin, np.float64) if per else self.y64[i]
            (y, y64), recs = reference.trajectory_multi(one, dirs, [np.asarray(xin, np.float32), x64], kernels=FAST)
            if per:
                self.seq_slabs[i][k] = (np.asarray(xin, np.float32), y, y64)
        else:
            y, recs = reference.trajectory(one, dirs, np.asarray(xin, np.float32), kernels=FAST)
        B, T, I = xin.shape
        N, P = B * T, escapes.N_PROBES
        px, ph, pc = escapes.probe_rows(layer.cell, I, recs[0]["h"].shape[-1], layer.hidden_size)
        xf = np.ascontiguousarray(np.concatenate([xin.reshape(N, I), px]), dtype=np.float32)
        entries, loose, counts, seen = [], [], [], []
        for d, (p, rec) in enumerate(zip(dirs, recs)):
            h0 = np.concatenate([rec["h"].reshape(N, -1), ph])  # the trajectory's states, then the probes
            c0 = None if rec["c"] is None else np.concatenate([rec["c"].reshape(N, -1), pc])
            parts: dict = {}
            xx = None
            if rec.get("xk") is not None:  # W_ih x of the states from the own equations' pass over the stored kernel
                pv, pm = bounds.lin(p.w_ih, px)  # the probes: zero and one-hot inputs, no product
                xx = tuple(np.concatenate([a, b]) for a, b in zip(rec["xk"], (pv, pm)))
            exact, bound = bounds.step_with_bound(one, p, xf, h0, c0, u, U_ACC, parts=parts, act_ulps=self.act_ulps,
                                                  xx=xx)
            entries.append(((h0, c0), exact, bound))
            g = states.gains(one, p, h0, c0, parts["xx"][0], parts["hh"][0], exact[0])
            counts.append(states.responsive(g[0], g[1]).sum(axis=0))
            seen.append([(g, (parts["xx"][0], parts["hh"][0]))])
            if _loose(exact, bound) > fraction(u):  # the bound alone cannot vouch: would the slips show?
                rows = np.r_[0:min(N, SWAP_STATES), N:N + P]  # the probes, and a few trajectory states
                esc = escapes.swap_escapes(one, p, h0, c0, parts, u, U_ACC, rows, act_ulps=self.act_ulps)
                loose.append((d, esc))
            del parts
        for d, esc in loose:  # the directions exchanged: on the probes, which both directions share
            if esc is None and len(dirs) == 2:
                esc = escapes.directions_escape(entries[d][1:], entries[1 - d][1:], slice(N, N + P))
            self.escapes[i].append((k, d, esc))
        xf, entries = self._exercise(i, k, one, dirs, xin, recs, xf, entries, counts, seen, u)
        self.slabs[i][k] = (xf, entries)
        self.traj[i] = y if k < layer.num_layers - 1 else None
        last = k == layer.num_layers - 1
        if own:  # from the file's tensors (not ``dirs``): once, at the end
            if last and self.y64[i] is None:
                self._own_run(i)
        elif shared:
            self.y32[i], self.y64[i] = y, y64
            if last:
                self.y32[i], self.y64[i] = (reference.finish(layer, a) for a in (self.y32[i], self.y64[i]))
        else:
            prev = [xs.astype(np.float32), xs.astype(np.float64)] if k == 0 else [self.y32[i], self.y64[i]]
            if per and k:
                prev[1] = np.asarray(prev[0], np.float64)
            self.y32[i], self.y64[i] = reference.forward_slab_multi(layer, dirs, prev, kernels=FAST)
            if per:
                self.seq_slabs[i][k] = (np.asarray(prev[0], np.float32), self.y32[i], self.y64[i])
            if last:
                self.y32[i], self.y64[i] = (reference.finish(layer, a) for a in (self.y32[i], self.y64[i]))
        if self.emulate is not None:
            self._emulate(i, k, one, dirs, own, per)
        if last:
            self.routes[i] = source.route(self.src_module, layer, self.mode)
            if self.mode == "framework":
                self.yfw[i] = source.framework_run(self.src_module, self.src_path, self.ckpt, layer, xs)
        gpu.forget()  # the slab's weights sent to the GPU (--device cuda): its arrays may be reused for the next
        self.seconds += time.perf_counter() - t0

    def _exercise(self, i: int, k: int, one: RNNLayer, dirs: list, xin: np.ndarray, recs: list, xf: np.ndarray,
                  entries: list, counts: list, seen: list, u: float) -> tuple[np.ndarray, list]:
        """States constructed from the weights of slab ``k`` of layer ``i`` for the gate rows that the trajectory
        and the probes leave unresponsive (:func:`rnnconvert.verify.states.exercise`), appended to ``xf`` and
        ``entries``; what they cover recorded in :attr:`coverage` (``(slab, direction, states, constructed,
        unexercised rows, resolution, fewest states any gate row is responsive in)``:
        :func:`rnnconvert.verify.states.resolution` on every state)."""
        def step(p, x, h, c):
            parts: dict = {}
            ex, bd = bounds.step_with_bound(one, p, x, h, c, u, U_ACC, parts=parts, act_ulps=self.act_ulps)
            return ex, bd, (parts["xx"][0], parts["hh"][0])
        xr, hr = states.ranges(one, xin, recs[0]["h"])
        rng = np.random.default_rng((self.rep.seed, i, k))
        xf, entries, added = states.exercise(one, dirs, xf, entries, counts, step, rng, xr, hr, seen)
        res = self._resolutions(one, dirs, xf, entries, seen)
        weak = [np.flatnonzero(~np.isfinite(r["rows"])) for r in res]  # a weight no state reaches
        if any(len(w) for w in weak):  # weights no state reaches: states for their rows, once
            xf, entries, more = states.exercise(one, dirs, xf, entries, counts, step, rng, xr, hr, seen, weak)
            added += more
            res = self._resolutions(one, dirs, xf, entries, seen)
        for d, (cnt, r) in enumerate(zip(counts, res)):
            self.coverage[i].append((k, d, xf.shape[0], added, np.flatnonzero(cnt < 1), r, int(cnt.min())))
        return xf, entries

    @staticmethod
    def _resolutions(one: RNNLayer, dirs: list, xf: np.ndarray, entries: list, seen: list) -> list[dict]:
        """:func:`rnnconvert.verify.states.resolution` of each direction on all its states."""
        out = []
        for p, got, ((h0, _), _, bound) in zip(dirs, seen, entries):
            cat = lambda parts: None if parts[0] is None else np.concatenate(parts)  # noqa: E731
            g = tuple(cat([s[0][j] for s in got]) for j in range(3))
            prods = tuple(cat([s[1][j] for s in got]) for j in range(2))
            out.append(states.resolution(one, p, xf, h0, g, prods, bound))
        return out

    def _emulate(self, i: int, k: int, one: RNNLayer, dirs: list, own: bool, per: bool) -> None:
        """The spread of the target's emulated arithmetic (``self.emulate``) from the float64 run on the short
        sequence of slab ``k`` of layer ``i`` while its parameters are loaded: for a layer compared slab by slab,
        slab ``k`` alone from its float32 input (:attr:`seq_slabs`); else chained over the slabs from the
        layer's input, the float64 side the CANONICAL equations' run, never the source's own equations (``y64``
        of a Keras or TF1 file): a gap between those (a reader's slip) must stay outside the tolerance, or it
        would widen the tolerance to cover itself."""
        layer = self.ckpt.layers[i]
        last = k == layer.num_layers - 1
        if per:
            xk, _y32, y64 = self.seq_slabs[i][k]
            em = self.emulate(one, xk, finished=False)
            self.spreads[i] = (self.spreads[i] or []) + [float(np.abs(np.asarray(y64, np.float64) - em).max())]
            return
        xs = self._seq_x(i)
        em_in, canon_in = (xs, xs) if k == 0 else self._em[i]
        em = self.emulate(one, em_in, finished=False)
        if own:
            canon = reference.forward_slab(one, dirs, np.asarray(canon_in, np.float64), np.float64, kernels=FAST)
        else:
            canon = None  # the numpy reference's float64 run is self.y64 (chained the same way)
        self._em[i] = (em, canon)
        if last:
            ref = reference.finish(layer, canon) if own else self.y64[i]
            self.spreads[i] = float(np.abs(ref - reference.finish(layer, em)).max())
            self._em[i] = None

    def _target_step(self, dst_module, dst_path, layer: RNNLayer, k: int, xf, states) -> tuple[list | None, str]:
        """The target's one step of slab ``k`` from ``states``; ``(results, note)``: ``note`` names a
        fallback (the numpy reference on the arrays read back from the written file, when the target's
        framework is not installed or the format has no ``target_step``)."""
        done = self._steps.pop((layer.name, k), None)
        if done is not None:  # computed with the slab's sequence (_slab_run)
            return done, ""
        fn = dst_module.target_step
        why = "no one-step runner for this format"
        if fn is not None:
            try:
                return fn(dst_path, self.ckpt, layer.name, k, xf, states), ""
            except DependencyError:
                why = NOT_INSTALLED
        whole = self._read_back(dst_path, dst_module, layer)  # the file's own semantics (a TF1 writer folds
        if whole is None:                                       # forget_bias into b_f)
            return None, why
        back = whole.one_slab(k)
        got = [reference.step(back, p, xf, s[0], s[1], kernels=FAST) for p, s in zip(back.params[0], states)]
        return got, f"one step by the numpy reference on the arrays read back ({why})"

    def _step_check(self, i: int, dst_path, dst_module) -> tuple[dict, str]:
        """The one-step comparison of layer ``i``: every slab and direction. Returns the numbers and a note."""
        layer = self.ckpt.layers[i]
        worst = {"ratio": 0.0, "err": 0.0, "bound": 0.0, "tol": 0.0, "loose": 0.0, "where": "", "n": 0,
                 "scale": 0.0}
        B, T = self.x[i].shape[:2]
        per_t = np.zeros((2, T))  # the largest error and bound element at each step t (the report's plot)
        note = ""
        for k, (xf, entries) in enumerate(self.slabs[i]):
            got, why = self._target_step(dst_module, dst_path, layer, k, xf, [e[0] for e in entries])
            if got is None:
                return {}, why
            note = note or why
            for d, ((h0, c0), (h1, c1), (dh, dc)), (th, tc) in zip(range(len(entries)), entries, got):
                worst["loose"] = max(worst["loose"], _loose((h1, c1), (dh, dc)))
                pairs = [(th, h1, dh, "h")] + ([] if c1 is None else [(tc, c1, dc, "c")])
                for tv, ev, bd, what in pairs:
                    tv = np.asarray(tv, np.float64)
                    if tv.shape != ev.shape:
                        raise VerificationError(f"verification failed: layer '{layer.name}' one-step output "
                                                f"shape {tv.shape} differs from the source's {ev.shape}")
                    ratio, err, bound, j = _worst(np.abs(tv - ev), bd)
                    scale = float(np.abs(ev).max())
                    if ratio >= worst["ratio"]:
                        B, T = self.x[i].shape[:2]
                        P = escapes.N_PROBES
                        at = (f"constructed state {j[0] - B * T - P}" if j[0] >= B * T + P else
                              f"probe {j[0] - B * T}" if j[0] >= B * T else f"sequence {j[0] // T}, step {j[0] % T}")
                        worst.update(ratio=ratio, err=err, bound=bound,
                                     where=f"stacked layer {k}, direction {d}, {what}, {at}")
                    rows = B * T  # the trajectory's states (row b * T + t), then the probes
                    e_t = np.nan_to_num(np.abs(tv[:rows] - ev[:rows]), nan=np.inf).reshape(B, T, -1).max(axis=(0, 2))
                    per_t[0] = np.maximum(per_t[0], e_t)
                    per_t[1] = np.maximum(per_t[1], bd[:rows].reshape(B, T, -1).max(axis=(0, 2)))
                    worst["err"] = max(worst["err"], float(np.nanmax(np.abs(tv - ev))))
                    worst["tol"] = max(worst["tol"], float(bd.max()))
                    worst["scale"] = max(worst["scale"], scale)
                    worst["n"] += ev.shape[0] - escapes.N_PROBES if what == "h" else 0
        worst["err_t"], worst["bound_t"] = per_t[0].tolist(), per_t[1].tolist()
        return worst, note

    def _read_back(self, dst_path, dst_module, layer: RNNLayer) -> RNNLayer | None:
        """``layer`` as the written file holds it, read back by rnnconvert's reader (the fallback target of
        both comparisons when the target's framework is missing): the file's own semantics, but for the
        run-time clips a checkpoint does not store (as the TF1 target does:
        rnnconvert.formats.tf.tf1_write.target_forward). ``None`` when rnnconvert cannot read the format."""
        if dst_module.read is None:
            return None
        if self._back is None:
            self._back = dst_module.read(dst_path)
        return self._back.layer(layer.name).with_semantics(cell_clip=layer.semantics.cell_clip,
                                                           proj_clip=layer.semantics.proj_clip)

    def _slab_run(self, i: int, k: int, x: np.ndarray, dst_path, dst_module) -> np.ndarray:
        """The target's slab ``k`` of layer ``i`` on ``x`` (``target_forward_slab``); where the format runs a slab's
        sequence and its one steps at once (``target_slab_check``), both, the steps kept for
        :meth:`_target_step`."""
        layer = self.ckpt.layers[i]
        fn, slab = dst_module.target_slab_check, self.slabs[i][k]
        if fn is not None and slab is not None:
            xf, entries = slab
            y, steps = fn(dst_path, self.ckpt, layer.name, k, x, xf, [e[0] for e in entries])
            self._steps[layer.name, k] = steps
            return y
        return dst_module.target_forward_slab(dst_path, self.ckpt, layer.name, k, x)

    def _sequence_target(self, i: int, dst_path, dst_module) -> tuple[list, str]:
        """The target's run of the short sequence as ``[(y, y32, ref)]``, each target output ``y`` with the source's
        float32 run and reference (float64, or the source framework's) of the same sequence: one entry for the
        whole layer, or one per slab (:meth:`_by_slab`: each slab of the target from the source's float32
        input of that slab). And a note naming a fallback: the numpy reference (float32, as a framework runs
        it) on the arrays read back from the written file, when the target's framework is not installed (a
        plain install writing ``.pt``, ``.npz``, ``.safetensors``)."""
        layer, xs = self.ckpt.layers[i], self._seq_x(i)
        ref = self.yfw[i] if self.mode == "framework" else self.y64[i]
        last = layer.num_layers - 1
        by_slab = dst_module.target_forward_slab
        if self._by_slab(layer):
            if by_slab is None:  # the source side stored per-slab references only: the chain has none to match
                raise RuntimeError(f"slab_targets was set for {dst_module.name}, which has no target_forward_slab")
            out = []
            for k, (xk, y32, y64) in enumerate(self.seq_slabs[i]):
                try:
                    y, note = self._slab_run(i, k, xk, dst_path, dst_module), ""
                except DependencyError:
                    back = self._read_back(dst_path, dst_module, layer)
                    if back is None:
                        raise
                    y = reference.forward_slab(back, back.params[k], xk, np.float32, kernels=FAST)
                    note = f"sequence by the numpy reference on the arrays read back ({NOT_INSTALLED})"
                out.append(tuple(reference.finish(layer, a) if k == last else a for a in (y, y32, y64)))
            return out, note
        try:
            if by_slab is not None and (layer.num_layers > 1 or dst_module.target_slab_check is not None):
                y = xs
                for k in range(layer.num_layers):
                    y = self._slab_run(i, k, y, dst_path, dst_module)
                return [(reference.finish(layer, y), self.y32[i], ref)], ""
            return [(dst_module.target_forward(dst_path, self.ckpt, layer.name, xs), self.y32[i], ref)], ""
        except DependencyError:
            back = self._read_back(dst_path, dst_module, layer)
            if back is None:
                raise
            y = reference.forward(back, xs, np.float32, kernels=FAST)  # finish applied, as target_forward returns it
            return [(y, self.y32[i], ref)], f"sequence by the numpy reference on the arrays read back ({NOT_INSTALLED})"

    def judge(self, i: int, dst_path, dst_module, target_route: str) -> LayerCheck:
        """Both comparisons of layer ``i`` against the written file, and the verdict."""
        layer = self.ckpt.layers[i]
        u = unit_roundoff(layer, self.target_dtype)
        rho = fraction(u)
        runs, seq_note = self._sequence_target(i, dst_path, dst_module)
        first = _first(layer, self.first_tol)
        # the spread of a run emulating the target's own arithmetic (_emulate; 0 for a target that declares none),
        # for the whole layer or for each slab
        spreads = self.spreads[i] if getattr(dst_module, "target_arithmetic", None) is not None else None
        if not isinstance(spreads, list):
            spreads = [spreads or 0.0] * len(runs)
        if len(spreads) != len(runs):
            raise RuntimeError(f"layer '{layer.name}': {len(spreads)} emulated spreads for {len(runs)} sequence runs")
        seqs = []  # (err, tolerance, scale) of the whole layer, or of each slab
        seq_t = None  # the largest error at each step (the report's plot)
        for (y, y32, ref), spread in zip(runs, spreads):
            y = np.asarray(y, np.float64)
            if y.shape != ref.shape:
                raise VerificationError(f"verification failed: layer '{layer.name}' output shape {y.shape} "
                                        f"differs from the source's {ref.shape}")
            e_t = np.nan_to_num(np.abs(y - ref), nan=np.inf).max(axis=(0, 2))
            seq_t = e_t if seq_t is None or seq_t.shape != e_t.shape else np.maximum(seq_t, e_t)
            own = float(np.abs(ref - np.asarray(y32, np.float64)).max())
            seqs.append((float(np.abs(y - ref).max()) if np.isfinite(y).all() else float("inf"),
                         sequence_tolerance(ref, y32, first, spread), float(np.abs(ref).max()), spread > own))
        st, note = self._step_check(i, dst_path, dst_module)
        over = [e for e in seqs if e[0] > e[1]]
        # over the tolerance by more than a layout slip moves the outputs (or with no one-step comparison)
        ill = [e for e in seqs if e[1] - first * max(1.0, e[2]) > rho * e[2]]  # the source's own runs part
        step_failed = bool(st) and st["ratio"] > 1.0
        # over the tolerance on an ill-conditioned layer (its source's own float32 and float64 runs part by more
        # than rho of the scale) while every step passed its bound: the float32 estimate of the tolerance is one
        # sample of a rounding that such a layer amplifies (a TF1 3 x GRUCell(80) stack with weights x 3.5: a
        # correct .onnx 0.405 from the float64 run where the source's float32 run was 0.11 from it): no evidence
        ill_over = [e for e in over if st and not step_failed and e[0] > rho * e[2] and e in ill]
        # over the tolerance by more than a layout slip moves the outputs (or with no one-step comparison)
        hard = [e for e in over if not (st and e[0] <= rho * e[2]) and e not in ill_over]
        worst = max(hard or seqs, key=lambda e: e[0] / max(e[1], 1e-300))  # the one reported
        seq_err, seq_tol, seq_scale = worst[:3]
        where = "" if len(seqs) == 1 else f" (stacked layer {seqs.index(worst)}, from the source's own input)"
        route = target_route + (" one-step + sequence" if st and not note else " (sequence)")
        if note.endswith(f"({NOT_INSTALLED})") and seq_note:  # neither comparison ran in the target framework
            route = (f"numpy reference on the arrays read back from the written file, one step + sequence "
                     f"({target_route.split(' ', 1)[0]} is not installed or failed to import)")
        else:
            for why in (w for w in (note, seq_note) if w):
                route += f"; {why}"
        c = LayerCheck(layer.name, seq_err, seq_tol, seq_scale, self.routes[i], route, "sequence",
                       seq_err=seq_err, seq_tol=seq_tol)
        c.seq_err_t = [] if seq_t is None else seq_t.tolist()
        self._coverage_into(i, c)
        if st:
            c.step_err, c.step_tol, c.step_ratio, c.steps_checked = st["err"], st["tol"], st["ratio"], st["n"]
            c.step_err_t, c.step_bound_t = st["err_t"], st["bound_t"]
            if st["ratio"] >= seq_err / max(seq_tol, 1e-300):
                c.max_abs_err, c.tolerance, c.reference = st["err"], st["bound"], "step"
        T = self._seq_x(i).shape[1]
        seq_esc = ill_esc = far = None
        if over and not hard and not ill_over and not step_failed:
            far = self._far_above(i, seqs, over, first)
            seq_esc = None if far else self._sequence_escapes(i, rho, [e[1] for e in seqs])
        if step_failed:  # final: nothing below may turn a failed step into another verdict
            c.verdict, c.reason = "fail", (f"one step from the source's state differs by {st['err']:.3g} where the "
                                           f"float bound allows {st['bound']:.3g} ({st['where']})")
        elif far is not None:
            c.verdict, c.reason = "inconclusive", far
        elif seq_esc is not None:
            # every step passed its bound, and the sequences part by less than a layout slip moves them: the
            # tolerance's float32 term (one float32 run's spread) is an estimate, not a bound, and a target's
            # own float32 rounding along the sequence can exceed it on wide-range inputs (a torch GRU on
            # N(0, 1) x 1000 inputs: 1.6e-5 against 1.3e-5, outputs of scale 1): cannot decide
            c.verdict, c.reason = "inconclusive", (
                f"the first {T} steps as a sequence{where} differ by {seq_err:.3g}, above the tolerance {seq_tol:.3g} "
                f"but within {rho:.3g} of the output's scale ({seq_scale:.3g}) while every step passed its "
                f"bound: float32 rounding along the sequence could explain it, and so could a file with "
                f"{seq_esc}")
        elif hard:
            c.verdict, c.reason = "fail", (f"the first {T} steps as a sequence{where} differ by {seq_err:.3g} "
                                           f"(tolerance {seq_tol:.3g})")
        elif ill_over:
            e = max(ill_over, key=lambda e: e[0] / max(e[1], 1e-300))
            at = "" if len(seqs) == 1 else f" (stacked layer {seqs.index(e)}, from the source's own input)"
            c.verdict, c.reason = "inconclusive", (
                f"the first {T} steps as a sequence{at} differ by {e[0]:.3g}, above the tolerance {e[1]:.3g}, on a "
                f"layer whose source's own float32 and float64 runs part by {(e[1] - first * max(1.0, e[2])) / 2:.3g}"
                f" (more than {rho:.3g} of the output's scale, {e[2]:.3g}): ill-conditioned on these inputs, while "
                f"every step passed its bound; float32 rounding along the sequence could explain it, and so could "
                f"a slip that only a sequence shows (directions, stacked layers, time order)")
        elif not st:
            c.verdict, c.reason = "inconclusive", f"the one-step comparison could not run: {note}"
        elif c.unexercised:
            c.verdict, c.reason = "inconclusive", (
                f"{c.unexercised}: unresponsive in every one-step state (the trajectory's, the probes and "
                f"{c.constructed} constructed from the weights), so a change of their weights or biases would "
                f"not show")
        elif c.resolution is not None and not np.isfinite(c.resolution):
            c.verdict, c.reason = "inconclusive", (
                f"a weight of {c.resolution_at} reaches no output in any one-step state (its input element is "
                f"zero wherever its row is live, also in the {c.constructed} states constructed from the weights): "
                f"a change of it would not show")
        elif st["loose"] > rho and not self._swaps_caught(i):
            esc = next((e for _, _, e in self.escapes[i] if e is not None), "")
            c.verdict, c.reason = "inconclusive", (
                f"the one-step bound (up to {st['tol']:.3g}) exceeds {rho:.3g} of the output's scale "
                f"({st['scale']:.3g}): too loose to tell a broken file from a correct one"
                + (f" ({esc.removeprefix('n/a: ')})" if esc.startswith("n/a") else
                   f" (a file with this slip could pass it: {esc})" if esc else ""))
        elif ill and (any(e[3] for e in ill) or
                      (ill_esc := self._sequence_escapes(i, rho, [e[1] for e in seqs])) is not None):
            e = max(ill, key=lambda e: (e[1] - first * max(1.0, e[2])) / max(e[2], 1e-300))
            tol, scale, by_target = e[1:]
            ill_at = "" if len(seqs) == 1 else f" of stacked layer {seqs.index(e)}"
            parted = ("a run emulating the target's arithmetic and the float64 run" if by_target else
                      "float32 and float64 runs of the source")
            c.verdict, c.reason = "inconclusive", (
                f"the sequence tolerance{ill_at} {tol:.3g} ({parted} part by "
                f"{(tol - first * max(1.0, scale)) / 2:.3g}) exceeds {rho:.3g} of "
                f"the output's scale ({scale:.3g}): the layer is ill-conditioned on these inputs"
                + (f" at {self.target_dtype.__name__}" if self.target_dtype is not None else "")
                + (f" (a file with this slip could pass it: {ill_esc})" if ill_esc else ""))
        elif st["loose"] > rho:
            c.reason = (f"the one-step bound (up to {st['tol']:.3g}) exceeds {rho:.3g} of the output's scale, "
                        f"but every gate-block swap and other layout slip checked would fail it on these states")
        if c.verdict == "ok" and (over or ill):
            c.reason = "; ".join(r for r in (c.reason, (
                f"the first {T} steps as a sequence{where} differ by {seq_err:.3g}, above the float32 estimate "
                f"{seq_tol:.3g} but within {rho:.3g} of the output's scale" if over else
                f"the sequence tolerance ({max(e[1] for e in seqs):.3g}) exceeds {rho:.3g} of the output's scale "
                f"(the source's float32 and float64 runs part)") + (
                ", while every step passed its bound and every sequence-level slip (directions exchanged, stacked "
                "layers exchanged, run in the other time order) would move the float64 sequence by more than twice "
                "that")) if r)
        return c

    def _coverage_into(self, i: int, c: LayerCheck) -> None:
        """The one-step states of layer ``i`` and what they left unexercised (:attr:`coverage`) into ``c``."""
        layer, cov = self.ckpt.layers[i], self.coverage[i]
        if not cov:
            return
        c.states = max(e[2] for e in cov)
        c.constructed = sum(e[3] for e in cov if e[1] == 0)
        where = lambda k, d: (f"stacked layer {k}, " if layer.num_layers > 1 else "") + (  # noqa: E731
            f"direction {d}, " if layer.bidirectional else "")
        c.unexercised = "; ".join(f"{where(e[0], e[1])}{states.describe(layer, e[4])}" for e in cov if len(e[4]))
        c.coverage = min(e[6] for e in cov)
        worst = max(cov, key=lambda e: e[5]["element"] if e[5]["element"] is not None else e[5]["bias"])
        res = worst[5]
        c.resolution = res["element"]
        c.bias_resolution = max(e[5]["bias"] for e in cov)
        c.row_resolution = max(e[5]["row"] for e in cov)
        c.resolution_at = f"{where(worst[0], worst[1])}{res['worst']}"

    def _layer_again(self, i: int) -> RNNLayer | str:
        """Layer ``i`` with its parameters in memory: as it is, or (a streamed conversion) read again where it
        is at most :data:`SEQ_SLIP_BYTES`; else why not (a phrase)."""
        from dataclasses import replace

        layer = self.ckpt.layers[i]
        if not self.ckpt.lazy:
            return layer
        nbytes = sum(int(a.size) * a.dtype.itemsize for dirs in layer.params for dp in dirs
                     for a in dp.arrays().values())
        if nbytes > SEQ_SLIP_BYTES:
            return f"the layer's {nbytes >> 20} MiB are not read again"
        try:
            return replace(layer, params=[self.ckpt.slab(i, k) for k in range(layer.num_layers)])
        except (OSError, ValueError, FormatError) as e:
            return f"the layer could not be read again: {e}"

    def _far_above(self, i: int, seqs: list, over: list, first: float) -> str | None:
        """Whether a sequence over its one-sample tolerance (``over``, among :meth:`judge`'s ``seqs``: ``(err,
        tol, scale, by_target)`` of the whole layer or of each slab) is also above
        :data:`rnnconvert.verify.orders.FAR` times the largest float32 spread measured over several evaluation
        orders of the canonical equations on the same inputs (:func:`rnnconvert.verify.orders.spread`; the
        tolerance's own spread counts too): then float32 rounding does not explain it and the verdict cannot be
        ``ok``. Returns the reason (a phrase), or None."""
        layer = self._layer_again(i)
        if isinstance(layer, str):
            return f"a sequence above its float32 estimate whose spread could not be measured again ({layer})"
        slabs = len(seqs) > 1
        for idx, e in enumerate(seqs):
            if e not in over:
                continue
            one, x, fin = ((layer.one_slab(idx), self.seq_slabs[i][idx][0], idx == layer.num_layers - 1) if slabs
                           else (layer, self._seq_x(i), True))
            err, tol, scale = e[:3]
            measured, used = orders.spread(one, x, finished=fin)
            measured = max(measured, (tol - first * max(1.0, scale)) / 2.0)
            far = first * max(1.0, scale) + orders.FAR * measured
            if err > far:
                at = f" of stacked layer {idx}" if slabs else ""
                return (f"the first {x.shape[1]} steps as a sequence{at} differ by {err:.3g}, "
                        f"{err / max(measured, 1e-300):.3g} times the largest float32 spread measured over "
                        f"{len(used)} evaluation orders ({measured:.3g}: {', '.join(used)}; limit {far:.3g}), while "
                        f"every step passed its bound: more than float32 rounding explains, less than a layout "
                        f"slip moves the outputs")
        return None

    def _sequence_escapes(self, i: int, rho: float, tols: list[float]) -> str | None:
        """Whether every slip that only the sequence comparison sees would move the short sequence of layer
        ``i`` (float64, the canonical equations) by more than twice ``rho`` of the output's scale or twice
        the sequence tolerance (``tols``: of the whole layer, or of each slab compared alone): a lone direction
        run in the other time order (``go_backwards`` flipped), the two directions of a slab exchanged, two
        stacked slabs of equal shapes exchanged. ``None`` when each does (a file holding one of them parts from
        the source by more than ``rho`` of the scale unless its own float32 rounding moved it by more than
        ``rho``, a hundred times what the source's own float32 run moved: the verdict is then ``fail``), else
        the first that does not, or why it cannot be checked: the source's parameters are not in memory (a
        streamed conversion), or the source's own equations and the canonical ones part (what the sequence
        comparison is there to see: a reader's slip). docs/cli.md "Verdicts"."""
        from dataclasses import replace

        layer = self._layer_again(i)
        if isinstance(layer, str):
            return f"a slip only a sequence shows ({layer} to rule it out)"
        xs = self._seq_x(i)
        cases = []  # (input, the correct layer, [(slip, slipped layer)]): slab by slab, or the whole layer
        if self._by_slab(layer):  # each slab of the target from the source's float32 input of that slab
            for k in range(layer.num_layers):
                one = layer.one_slab(k)
                slips = [(f"the directions of stacked layer {k} exchanged",
                          replace(one, params=[list(reversed(one.params[0]))]))] if layer.bidirectional else []
                for j in (k - 1, k + 1):  # a neighbour's weights in its place
                    if 0 <= j < layer.num_layers and all(
                            a.shape == b.shape for pa, pb in zip(layer.params[j], one.params[0])
                            for a, b in zip(pa.arrays().values(), pb.arrays().values())):
                        slips.append((f"stacked layer {j}'s weights in layer {k}'s place",
                                      replace(one, params=[layer.params[j]])))
                cases.append((self.seq_slabs[i][k][0], one, slips))
        else:
            canon = reference.forward(layer, xs, kernels=FAST)
            ref = self.yfw[i] if self.mode == "framework" else self.y64[i]
            if ref is None or ref.shape != canon.shape or \
                    float(np.abs(canon - ref).max()) > 1e-3 * rho * max(1.0, float(np.abs(canon).max())):
                return "a reader's slip (the source's own equations and rnnconvert's reading of them part)"
            slips = []
            for k in range(layer.num_layers):
                if layer.bidirectional:
                    params = list(layer.params)
                    params[k] = list(reversed(params[k]))
                    slips.append((f"the directions of stacked layer {k} exchanged", replace(layer, params=params)))
                if k + 1 < layer.num_layers and layer.layer_input_size(k) == layer.layer_input_size(k + 1):
                    params = list(layer.params)
                    params[k], params[k + 1] = params[k + 1], params[k]
                    slips.append((f"stacked layers {k} and {k + 1} exchanged", replace(layer, params=params)))
            cases.append((xs, layer, slips))
        for (x, good, slips), tol in zip(cases, tols):
            if not good.bidirectional:
                slips.append(("the time order flipped (go_backwards)",
                              good.with_semantics(go_backwards=not good.semantics.go_backwards)))
            base = _unfinished(good, x)
            scale = max(float(np.abs(base).max()), 1e-300)
            for desc, var in slips:
                moved = _unfinished(var, x)
                if float(np.abs(moved - base).max()) <= 2.0 * max(rho * scale, tol):
                    return desc
        return None

    def _swaps_caught(self, i: int) -> bool:
        """Whether every loose direction of layer ``i`` showed that all its gate-block swaps are caught
        (:func:`rnnconvert.verify.escapes.swap_escapes` returned None for each)."""
        return bool(self.escapes[i]) and all(e is None for _, _, e in self.escapes[i])

    @_one_blas_thread
    def target_side(self, dst_path, dst_module, progress=None) -> VerifyReport:
        """Run the written file in the target framework and compare, layer by layer; returns the report.
        ``progress(done, total)``: layers verified so far."""
        t0 = time.perf_counter()
        dst_module = as_target(dst_module)
        target_route = _engine(dst_module)
        self.pool.clear()  # the source side is done: its buffers go before the target framework runs
        if progress is not None:
            progress(0, len(self.ckpt.layers))
        try:
            for i in range(len(self.ckpt.layers)):
                self.rep.layers.append(self.judge(i, dst_path, dst_module, target_route))
                gpu.forget()
                if progress is not None:
                    progress(i + 1, len(self.ckpt.layers))
        finally:
            release = dst_module.release  # a cached target session (onnxruntime)
            if release is not None:
                release()
            kernels.release_scratch()
            self._back = None
        self.target_seconds += time.perf_counter() - t0
        self.rep.seconds = self.seconds + self.target_seconds  # a second target (the other cuDNN route) adds its own
        return self.rep


def verify(src_ckpt: Checkpoint, src_module, dst_path, dst_module, *, mode: str = "reference",
           src_path=None, seed: int = 0, batch: int | None = None, steps: int | None = None,
           first_tol: float | None = None, inputs: dict[str, np.ndarray] | None = None,
           target_dtype=None) -> VerifyReport:
    """Run every recurrent layer of ``src_ckpt`` on one batch on both sides and compare (module docstring).

    Args:
        src_ckpt: the checkpoint as read from the source (in memory).
        src_module / dst_module: the format modules of source and target; ``dst_module`` a list: several
            targets of the same file (the cuDNN routes, which share ``act_ulps`` and ``target_arithmetic``),
            judged against one source side, their layers in one report.
        dst_path: the written file (temporary path before it is renamed into place).
        mode: ``'reference'`` (numpy equations of the source) or ``'framework'`` (the source framework,
            for the sequence comparison).
        seed, batch, steps: the random batch ``x ~ N(0, 1)`` of shape ``(batch, steps, input_size)``
            (default: :func:`sample_shape`).
        first_tol: the relative term of the sequence tolerance (default 1e-5, 1e-2 for float16 weights).
        inputs: ``{layer name: (B, T, input_size) array}``: real inputs to verify those layers on instead
            of the random batch (any length: the one-step comparison's tolerance does not grow with it).
        target_dtype: ``np.float16`` when the target runs in float16 (the cuDNN route's ``--dtype``).

    Raises:
        FormatError: ``inputs`` of the wrong shape or naming no layer.

    Returns:
        a :class:`VerifyReport`; :meth:`VerifyReport.raise_if_failed` turns failure into an error.
    """
    t0 = time.perf_counter()
    targets = [as_target(t) for t in (dst_module if isinstance(dst_module, (list, tuple)) else [dst_module])]
    check = StreamedVerification(src_ckpt, src_module, mode=mode, src_path=src_path, seed=seed, batch=batch,
                                 steps=steps, inputs=inputs, first_tol=first_tol, target_dtype=target_dtype,
                                 target=targets[0])
    try:
        for i, layer in enumerate(src_ckpt.layers):
            for k in range(layer.num_layers):
                check.source_slab(i, k, layer.params[k])
    finally:
        kernels.release_scratch()
    for t in targets:  # one source side for every target (the two cuDNN routes): one report, their layers in turn
        rep = check.target_side(dst_path, t)
    rep.seconds = time.perf_counter() - t0
    return rep
