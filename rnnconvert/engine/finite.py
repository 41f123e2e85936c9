"""The NaN/Inf rule of :func:`rnnconvert.api.load` (docs/architecture.md "What is decided where"): a non-finite
value in any recurrent parameter or carried tensor is refused with one line naming it (:func:`check_finite`, on
every checkpoint; :func:`check_arrays`, on each slab a lazy reader loads later:
:class:`rnnconvert.engine.checked.CheckedSlabs`). The test itself is :func:`rnnconvert.core.finite.all_finite`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..core.finite import all_finite
from ..core.model import Checkpoint, is_placeholder
from ..errors import FormatError


def check_arrays(arrays: dict[str, Any], layer: str, k: int, d: int, where: str,
                  checked: Callable[[Any], None] | None) -> None:
    for name, arr in arrays.items():
        a = np.asarray(arr)
        if not all_finite(a):
            raise FormatError(f"{where}: layer '{layer}' (layer {k}, direction {d}) {name} "
                              f"contains NaN or Inf values; the checkpoint is damaged")
        if checked is not None:
            checked(a)


def check_finite(ckpt: Checkpoint, where: str, checked: Callable[[Any], None] | None = None) -> None:
    """Refuse NaN/Inf in any recurrent parameter or carried tensor, naming the first one found.

    Every reader goes through :func:`rnnconvert.api.load`, so the rule is the same for every format: a
    non-finite weight means a damaged (or diverged) checkpoint, and converting it exactly would
    only move the damage. ``checked(a)``, when given, is called on each recurrent parameter once it
    passed (a lazy reader's ``release_array``). Raises :class:`FormatError`.
    """
    for layer in ckpt.layers:
        for k, dirs in enumerate(layer.params):
            for d, dp in enumerate(dirs):
                check_arrays({n: a for n, a in dp.arrays().items() if not is_placeholder(np.asarray(a))},
                              layer.name, k, d, where, checked)  # a lazy slab not loaded yet: checked when read
    for name, arr in ckpt.tensors.items():
        if not all_finite(np.asarray(arr)):
            raise FormatError(f"{where}: tensor '{name}' contains NaN or Inf values; the checkpoint is damaged")
