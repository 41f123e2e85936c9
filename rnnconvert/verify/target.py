"""The two sides verification compares, bound from a container's record and the runtimes it names
(docs/architecture.md "Runtimes"): :class:`Target`, a written file run by its runtime, and :class:`Source`, the
source's own equations and framework. The verification engine (:mod:`.engine`) uses nothing else of a format;
another target (the cuDNN routes of :class:`rnnconvert.verify.cuda.CudaTarget`) offers the same attributes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .. import runtimes
from ..core.model import Checkpoint
from ..engine.protocol import FormatSpec


class Target:
    """A written file's side of verification: ``spec`` (the container: ``name``, ``read`` for reading the file
    back, ``route``) and the runtime it names (:attr:`FormatSpec.runtime`), whose operations get the
    container's :attr:`FormatSpec.load`. An operation the runtime lacks is ``None`` (``target_forward`` ``None``:
    no runtime runs the file; verification then runs the numpy reference on the arrays read back).

    Attributes: ``target_forward(path, ckpt, name, x)``, ``target_forward_slab(path, ckpt, name, k, x)``,
    ``target_step(path, ckpt, name, k, x, states)``, ``target_slab_check(path, ckpt, name, k, x, xf, states)``,
    ``target_forward_wired(path, ckpt, name, x, slab_xs)``
    (shapes and dtypes: :class:`rnnconvert.engine.protocol.Runtime`), ``verify_whole``, ``release``, ``engine``
    (the distribution whose version the report gives; ``route`` and ``engine`` are the stand-in's where the
    runtime's framework is missing, :attr:`Runtime.stand_in`), ``act_ulps``, ``target_arithmetic``."""

    def __init__(self, spec: FormatSpec) -> None:
        rt = runtimes.get(spec.runtime) if spec.runtime else None
        self.spec, self.runtime = spec, rt
        self.name, self.read = spec.name, spec.read
        self._sides: tuple[str, str] | None = None  # (engine, route), asked for when the report first needs them
        self.act_ulps = rt.act_ulps if rt is not None else None
        self.target_arithmetic = rt.arithmetic if rt is not None else None
        self.verify_whole = rt.verify_whole if rt is not None else None
        self.target_forward = self._op("forward")
        self.target_forward_slab = self._op("forward_slab")
        self.target_step = self._op("step")
        self.target_slab_check = self._op("slab_check")
        self.target_forward_wired = self._op("forward_wired")
        #: the runtime's slabs are joined by the file's own wiring (:attr:`Runtime.wired`): ``forward`` runs it
        self.target_wired = bool(rt is not None and rt.wired)
        #: the written file is a whole-model program judged by ``verify_whole`` only (:attr:`Runtime.whole_only`)
        self.target_whole_only = self._op("whole_only")
        self.release = self._release if spec.release is not None or (rt is not None and rt.release is not None) else None

    def _engine_route(self) -> tuple[str, str]:
        """``(engine, route)``: the runtime's, or its stand-in's where the runtime's framework cannot be imported
        (:attr:`Runtime.stand_in`, asked once, when verification first reports: a conversion that does not
        verify never imports the framework for it)."""
        if self._sides is None:
            rt = self.runtime
            sub = rt.stand_in() if rt is not None and rt.stand_in is not None else None
            self._sides = sub if sub is not None else (rt.engine if rt is not None else "", self.spec.route)
        return self._sides

    @property
    def engine(self) -> str:
        return self._engine_route()[0]

    @engine.setter
    def engine(self, value: str) -> None:
        self._sides = (value, self._engine_route()[1])

    @property
    def route(self) -> str:
        return self._engine_route()[1]

    @route.setter
    def route(self, value: str) -> None:  # a target built on this one that names its route (tests' stand-ins)
        self._sides = (self._engine_route()[0], value)

    def _op(self, name: str):
        fn = getattr(self.runtime, name) if self.runtime is not None else None
        if fn is None:
            return None
        load = self.spec.load

        def op(*args):
            return fn(*args, load)
        op.__name__ = f"{self.name}:{self.runtime.name}.{name}"
        return op

    def _release(self) -> None:
        if self.spec.release is not None:
            self.spec.release()
        if self.runtime is not None and self.runtime.release is not None:
            self.runtime.release()


class Source:
    """A source file's side of verification: the runtime of its own equations on its stored tensors
    (:attr:`FormatSpec.equations`: ``source_forward``, ``source_forward_multi``, ``None`` when it has none) and of
    its framework (:attr:`FormatSpec.framework`: ``framework_forward``, loaded when first called)."""

    def __init__(self, spec: FormatSpec) -> None:
        eq = runtimes.get(spec.equations) if spec.equations else None
        self.name, self.spec = spec.name, spec
        self.source_forward = eq.source_forward if eq is not None else None
        self.source_forward_multi = eq.source_forward_multi if eq is not None else None
        self.framework_forward = self._framework if spec.framework else None

    def _framework(self, path: str | Path, ckpt: Checkpoint, name: str, x: np.ndarray) -> np.ndarray:
        return runtimes.get(self.spec.framework).framework_forward(path, ckpt, name, x)


def as_target(t):
    """``t`` as a :class:`Target` when it is a container's record; another target object as it is."""
    return Target(t) if isinstance(t, FormatSpec) else t


def as_source(s):
    """``s`` as a :class:`Source` when it is a container's record; another source object as it is."""
    return Source(s) if isinstance(s, FormatSpec) else s
