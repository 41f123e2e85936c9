"""The engine/format contract: what a format declares, in one record per format (:class:`FormatSpec`).

A format family (``rnnconvert/formats/<family>/``) declares one :class:`FormatSpec` per registry name in
its ``spec.py``; the registry (:mod:`rnnconvert.engine.registry`) names where each record lives, and the
engine (``api``, ``verify``, ``matrix``) uses nothing of a format but its record. A field left ``None``
is a capability the format does not have; nothing is probed with ``getattr``/``hasattr``.

Roles (each a group of fields):

* **reader** -- ``sniff(head: bytes, path: Path) -> bool`` (the first 64 bytes; ``b""`` for a path that
  names no file, e.g. a TF checkpoint prefix), ``read(path, **options) -> Checkpoint``, the option names
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
* **runtimes** (verification) -- ``source_forward(layer, x, dtype, raw)`` (the source's own equations on the
  file's tensors: ``raw``, one mapping per direction read by verification from ``layer.source['raw']``;
  the layer is never changed), ``framework_forward(path, ckpt, layer_name, x)`` (the source framework itself),
  ``target_forward(path, ckpt, layer_name, x)`` and ``target_forward_slab(path, ckpt, layer_name, k, x)``
  (the written file in its framework), ``source_forward_multi(layer, xs, raw, record=None)`` (several batches
  at once, in lockstep; ``record``: one dict per direction to fill with the states of ``xs[0]``'s run, as
  :func:`rnnconvert.core.reference.trajectory` records them, where the format can; left empty otherwise),
  ``target_step(path, ckpt, layer_name, k, x, states) -> [(h1, c1 or None)]`` (one step of stacked layer
  ``k`` from each of ``N`` states: verification's one-step comparison, :mod:`rnnconvert.verify.engine`),
  ``target_slab_check(path, ckpt, layer_name, k, x, xf, states) -> (y, steps)`` (both of slab ``k`` in one run
  of the framework, where it can), ``release()`` (drop a cached session), ``route`` (the words the report uses for the target side) and
  ``engine`` (the distribution whose version the report gives, e.g. ``'torch'``).

A writer sees each layer as :attr:`FormatSpec.forget_bias` says (folded by the engine, or kept).

``write`` and ``open_stream`` assume ``check`` passed: the engine (``api.save``, ``api.convert`` eager and
streamed, ``engine.matrix``) calls ``check`` once, with the same options, before either; a writer does not
call it again. A public path that reaches a writer's verbs another way calls ``check`` first too
(``api.torch_modules``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
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
    sniff: Callable[[bytes, Path], bool] | None = None
    read: Callable[..., Any] | None = None
    read_options: tuple[str, ...] = ()
    lazy: bool = False
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
    # runtimes (verification)
    source_forward: Callable[..., Any] | None = None
    framework_forward: Callable[..., Any] | None = None
    source_forward_multi: Callable[..., Any] | None = None
    target_forward: Callable[..., Any] | None = None
    target_forward_slab: Callable[..., Any] | None = None
    target_step: Callable[..., Any] | None = None
    #: ``target_slab_check(path, ckpt, layer_name, k, x, xf, states) -> (y, steps)``: ``target_forward_slab`` on
    #: ``x`` and ``target_step`` on ``xf`` from ``states`` in one run of the framework, for one that can do both
    #: at once (torch: a packed batch; each weight read once for both); verification prefers it
    target_slab_check: Callable[..., Any] | None = None
    #: whole-model verification of a written Keras model (``verify_whole(ckpt, src_path, dst_path, inputs=,
    #: seed=) -> list[LayerCheck]``), for writers that write a whole model, not only its recurrent layers
    verify_whole: Callable[..., Any] | None = None
    release: Callable[[], None] | None = None
    route: str = ""
    engine: str = ""
    #: a target less accurate than float32 numpy declares it (the cuDNN target,
    #: :class:`rnnconvert.verify.cuda.CudaTarget`): ``act_ulps``, the accuracy of its activations in ulps
    #: that the one-step bound allows (None: :data:`rnnconvert.core.reference.ACT_ULPS`), and
    #: ``target_arithmetic(layer, x) -> y``, an emulation of its run of the canonical ``layer`` whose spread from
    #: the canonical float64 run widens the sequence tolerance (:func:`rnnconvert.verify.engine.sequence_tolerance`)
    act_ulps: float | None = None
    target_arithmetic: Callable[..., Any] | None = None
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
