"""The engine/format contract: what a format declares, in one record per format (:class:`FormatSpec`).

A format family (``rnnconvert/formats/<family>/``) declares one :class:`FormatSpec` per registry name in
its ``spec.py``; the registry (:mod:`rnnconvert.engine.registry`) names where each record lives, and the
engine (``api``, ``verify``, ``matrix``) uses nothing of a format but its record. A field left ``None``
is a capability the format does not have; nothing is probed with ``getattr``/``hasattr``.

Roles (each a group of fields):

* **reader** -- ``read(path, **options) -> Checkpoint``, the option names
  it accepts (:attr:`read_options`; anything else is refused with the valid ones named, see
  :meth:`FormatSpec.check_options`), and ``lazy``: ``read(path, lazy=True)`` gives a checkpoint of
  placeholder parameters whose ``source`` is a :class:`~rnnconvert.core.model.SlabSource` (built with the
  checkpoint; slabs read one at a time, docs/performance.md "Streaming conversion").
* **writer** -- ``refusals(layer) -> list[str]`` (empty: the target expresses the layer exactly),
  ``check(ckpt, **options) -> list[str]`` (raises :class:`~rnnconvert.engine.refusal.Refused`; returns
  notes), ``write(ckpt, path, **options) -> list[str]`` (``path`` is a temporary path the engine renames
  into place; one line per layer says how to load it), :attr:`write_options`.
* **slab writer** -- ``open_stream(ckpt, path, **options) -> SlabWriter`` (:class:`SlabWriter`); ``ckpt``
  may be lazy: the slabs arrive through ``write_slab``, and a writer done with one array of a slab may
  give its pages back with ``ckpt.release_array(a)`` (a no-op for an eager checkpoint).
* **runtimes** (verification) -- a container names the :class:`Runtime` that executes what it holds
  (:attr:`FormatSpec.runtime`, with :attr:`FormatSpec.load`, the container's way of handing a written file to
  it), the runtime of the source's own equations (:attr:`FormatSpec.equations`) and the framework that runs a
  source file (:attr:`FormatSpec.framework`). A runtime is declared once per framework
  (``rnnconvert/runtimes/<framework>.py``, listed in :data:`rnnconvert.runtimes.RUNTIMES`); verification
  (:mod:`rnnconvert.verify`) binds the two (:class:`rnnconvert.verify.target.Target`).

A writer sees each layer as :attr:`FormatSpec.forget_bias` says (folded by the engine, or kept).

``write`` and ``open_stream`` assume ``check`` passed: the engine (``api.save``, ``api.convert`` eager and
streamed, ``engine.matrix``) calls ``check`` once, with the same options, before either; a writer does not
call it again. A public path that reaches a writer's verbs another way calls ``check`` first too
(``api.torch_modules``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ..errors import OptionError


class SlabWriter(Protocol):
    """A streaming writer (``FormatSpec.open_stream``): :func:`rnnconvert.engine.stream.stream_write` calls
    ``write_slab(i, k, dirs)`` once per slab, ``i`` then ``k`` ascending, then ``close()`` (the per-layer
    lines); ``abort()`` on any error (no partial output is left). ``WRITE_BEHIND`` true: ``write_slab``
    spends its time in code that releases the GIL, so it may run one slab behind the reading, in a thread."""

    WRITE_BEHIND: bool

    def write_slab(self, i: int, k: int, dirs: list) -> None: ...

    def close(self) -> list[str]: ...

    def abort(self) -> None: ...


@dataclass(eq=False)
class FormatSpec:
    """One format's declared capabilities (module docstring). Not frozen only so that tests can spy on a
    verb (``monkeypatch.setattr(spec, "open_stream", ...)``); the engine never changes a record."""

    name: str
    # reader
    read: Callable[..., Any] | None = None
    read_options: tuple[str, ...] = ()
    lazy: bool = False
    #: ``whole_model(ckpt) -> model | None``: the whole model behind a checkpoint read from this container (a
    #: Keras full model: ``.config`` the model_config, ``.weights`` every layer's stored weights), for the writers
    #: that take the write option ``whole_model`` (the engine passes it, except under ``recurrent_only``)
    whole_model: Callable[..., Any] | None = None
    # writer
    refusals: Callable[..., list[str]] | None = None
    check: Callable[..., list[str]] | None = None
    write: Callable[..., list[str]] | None = None
    write_options: tuple[str, ...] = ()
    open_stream: Callable[..., SlabWriter] | None = None
    #: how the writer takes a TF1 cell's run-time ``forget_bias`` (decided once, by the engine:
    #: :func:`rnnconvert.engine.stream.writer_view`): ``"fold"`` -- the engine adds it into ``b_ih`` of the
    #: forget gate (one rounding per element) before ``write``/``open_stream``/``write_slab``, so the writer
    #: only ever sees ``forget_bias == 0``; ``"keep"`` -- the writer stores it with the layer (npz)
    forget_bias: str = "fold"
    # verification: the runtimes that execute this container's tensors (docs/architecture.md "Runtimes")
    #: the registered :class:`Runtime` (``rnnconvert.runtimes``) that runs a file written in this container
    #: (verification's target side); ``None``: no runtime runs it (the numpy reference on the arrays read back)
    runtime: str | None = None
    #: how :attr:`runtime` gets the written file's tensors, in the form that runtime documents (e.g. the torch
    #: runtime: ``load(path, layer, k) -> {state-dict key: tensor}``); ``None`` for runtimes that open the file
    #: themselves (onnxruntime, Keras 3, TensorFlow)
    load: Callable[..., Any] | None = None
    #: drop what :attr:`load` keeps cached of the last written file (a mapping, a session)
    release: Callable[[], None] | None = None
    #: the words the report uses for the target side (the runtime's version is appended)
    route: str = ""
    #: the registered :class:`Runtime` holding the source's own equations on its stored tensors
    #: (``source_forward``: Keras, TF1 cells), used when this container is the source; ``None``: the numpy reference
    equations: str | None = None
    #: the registered :class:`Runtime` that runs a source file of this container in its own framework
    #: (``--verify framework``: ``framework_forward``)
    framework: str | None = None
    # refusal hints
    #: ``rescale_plan(layer) -> plan | None``: a gate activation this writer meets only by scaled weights
    #: (Keras-2 hard_sigmoid into Keras 3): the way out names it "rescaled, not bit-exact"
    rescale_plan: Callable[..., Any] | None = None

    @property
    def stream(self) -> bool:
        """Whether the writer takes one slab at a time (``open_stream``)."""
        return self.open_stream is not None

    def check_options(self, role: str, opts: dict[str, Any]) -> None:
        """Refuse an option the reader (``role='read'``) or writer (``'write'``) does not take: one line
        naming it and the valid ones. Raises :class:`~rnnconvert.errors.OptionError` (a FormatError; CLI
        exit code 2)."""
        valid = self.read_options if role == "read" else self.write_options
        unknown = sorted(set(opts) - set(valid))
        if unknown:
            what = "reader" if role == "read" else "writer"
            raise OptionError(f"the {self.name} {what} takes no option {', '.join(repr(u) for u in unknown)}; "
                              f"valid: {', '.join(valid) if valid else 'none'}")


@dataclass(eq=False)
class Runtime:
    """A framework that executes canonical layers for verification, declared once per framework in
    ``rnnconvert/runtimes/<framework>.py`` (``RUNTIME``) and named by the containers it runs
    (:attr:`FormatSpec.runtime`, :attr:`FormatSpec.equations`, :attr:`FormatSpec.framework`). A ``None``
    operation is one the framework does not offer.

    Target side, on a written file ``path`` whose checkpoint is ``ckpt`` (``load``: the container's
    :attr:`FormatSpec.load`, or ``None``); results float64, outputs ``(B, T, dirs*out)`` in the layer's own
    time order, steps ``[(h1 (N, out), c1 (N, H) or None)]`` per direction:

    * ``forward(path, ckpt, name, x, load)``: layer ``name`` on ``x`` ``(B, T, I)`` from zero states;
    * ``forward_slab(path, ckpt, name, k, x, load)``: stacked layer ``k`` alone on its input;
    * ``step(path, ckpt, name, k, x, states, load)``: one step of stacked layer ``k`` from each of ``N``
      states (``states[d] = (h0, c0 or None)``), ``x`` ``(N, I_k)``: verification's one-step comparison;
    * ``slab_check(path, ckpt, name, k, x, xf, states, load) -> (y, steps)``: ``forward_slab`` on ``x`` and
      ``step`` on ``xf`` in one run, where the framework can (torch: a packed batch);
    * ``forward_wired(path, ckpt, name, x, slab_xs, load) -> (whole, ys, joined)``: of a :attr:`wired` runtime,
      ``forward`` on ``x``, ``forward_slab`` of each stacked layer ``k`` on ``slab_xs[k]`` and the slabs run alone
      chained from ``x`` (not finished), in one pass over the weights where the framework can (onnxruntime: each
      node's batch extended);
    * ``verify_whole(ckpt, src_path, dst_path, inputs=, seed=) -> list[LayerCheck]``: a whole model written by
      the container (Keras 3), run end to end against the source model's own framework.

    Source side: ``source_forward(layer, x, dtype, raw)`` and ``source_forward_multi(layer, xs, raw,
    record=None)`` (the source format's own equations on the file's tensors ``raw``, one mapping per
    direction; ``record``: one dict per direction to fill with the states of ``xs[0]``'s run, as
    :func:`rnnconvert.core.reference.trajectory` records them), ``framework_forward(path, ckpt, name, x)`` (a
    source file run by its framework).

    Accuracy: ``act_ulps``, the accuracy of the runtime's activations in ulps that the one-step bound allows
    (``None``: :data:`rnnconvert.verify.bounds.ACT_ULPS`); ``arithmetic(layer, x, finished=True) -> y``, an emulation of
    its run (``finished=False``: one slab's output as it feeds the next) whose spread from the canonical float64 run widens the sequence tolerance
    (:func:`rnnconvert.verify.engine.sequence_tolerance`). ``engine``: the distribution whose version the
    report gives (``'torch'``)."""

    name: str
    engine: str = ""
    forward: Callable[..., Any] | None = None
    forward_slab: Callable[..., Any] | None = None
    step: Callable[..., Any] | None = None
    slab_check: Callable[..., Any] | None = None
    forward_wired: Callable[..., Any] | None = None
    verify_whole: Callable[..., Any] | None = None
    source_forward: Callable[..., Any] | None = None
    source_forward_multi: Callable[..., Any] | None = None
    framework_forward: Callable[..., Any] | None = None
    act_ulps: float | None = None
    arithmetic: Callable[..., Any] | None = None
    #: drop what the runtime keeps cached of the last written file (an onnxruntime session)
    release: Callable[[], None] | None = None
    #: ``stand_in() -> (engine, route) | None``: where the runtime's framework cannot be imported and its operations
    #: run another framework in its place (the paddle runtime: torch on the file's tensors as read back), the
    #: distribution whose version the report gives and the words of the report's target side; ``None`` while
    #: its own framework runs (called once per :class:`rnnconvert.verify.target.Target`)
    stand_in: Callable[[], tuple[str, str] | None] | None = None
    #: the stacked slabs of a written layer are separate operations joined by the file's own wiring (an ONNX
    #: graph's ``Transpose``/``Reshape`` between its nodes), which ``forward_slab`` and ``step`` never run:
    #: verification then also runs ``forward`` on the whole layer and compares it with its slabs run one by one and
    #: joined as the source joins them (issue #39)
    wired: bool = False
    #: ``whole_only(path, ckpt, load) -> bool``: the written file is a program of a whole model, judged by
    #: ``verify_whole`` alone, not layer by layer (a ``.pt2`` of a whole model; one of the recurrent layers alone runs
    #: ``forward`` and ``step`` for the per-layer engine, issue #39); ``None``: decided by the file's reader
    whole_only: Callable[..., Any] | None = None


def located(where: str) -> Callable[..., Any]:
    """The function at ``where`` (``"package.module:function"``), imported on its first call: how a record below
    ``rnnconvert/whole/`` (a container's whole-model writer, a runtime's ``verify_whole``) names an operation of
    the whole-model compiler without importing it (docs/architecture.md: ``whole/`` is above ``formats/`` and
    ``runtimes/``), so that a conversion of recurrent layers imports nothing of it; a family's record names its
    own whole-model readers so too (``whole_model``: read only for a writer of whole models). The registry names
    format records the same way (:class:`rnnconvert.engine.registry.Format`).

    Raises (on the call):
        ImportError, AttributeError: ``where`` names nothing (a programming error, caught by
        ``tests/engine/test_architecture.py``)."""
    import importlib

    module, _, attr = where.partition(":")

    def call(*args: Any, **kwargs: Any) -> Any:
        return getattr(importlib.import_module(module), attr)(*args, **kwargs)

    call.__name__ = call.__qualname__ = attr
    call.location = where  # type: ignore[attr-defined]
    return call
