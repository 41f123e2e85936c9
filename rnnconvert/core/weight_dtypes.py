"""Which element types a recurrent layer's parameters may have: IEEE floats of 16, 32 or 64 bits, and
bfloat16 (``ml_dtypes``). Anything else is refused by name before a reader computes with it:

* integer and boolean tensors are not a trained RNN's parameters (quantized weights need their scales,
  which such a tensor does not carry; a bool tensor is a mask);
* complex tensors would be "verified" on their real parts only;
* extended floats (``float128``/``longdouble``: 80-bit x87 in 16 bytes) exist in no framework rnnconvert
  writes, and narrowing them would change the weights.
"""

from __future__ import annotations

import numpy as np

from ..errors import FormatError

#: The float widths rnnconvert reads and writes exactly.
FLOAT_SIZES = (2, 4, 8)


def refusal(dtype: object) -> str | None:
    """Why ``dtype`` cannot hold recurrent parameters, or ``None`` when it can."""
    try:
        dt = np.dtype(dtype)
    except TypeError:
        name = str(dtype).replace("torch.", "")
        dt = None
    if dt is not None:
        name = dt.name
        if dt.kind == "f" and dt.itemsize in FLOAT_SIZES:
            return None
        if dt.name == "bfloat16":
            return None
        kind = dt.kind
    else:
        kind = "b" if name == "bool" else "c" if name.startswith("complex") else \
            "i" if "int" in name else "f" if name in ("float16", "float32", "float64", "bfloat16", "half",
                                                       "float", "double") else "?"
        if kind == "f":
            return None
    if kind in "iu":
        return f"integer weights ({name}) are not a trained RNN's parameters"
    if kind == "b":
        return f"boolean weights ({name}) are not a trained RNN's parameters"
    if kind == "c":
        return f"complex weights ({name}) are not a real RNN's parameters (only their real parts would be checked)"
    if kind == "f":
        return f"{name} weights ({dt.itemsize * 8}-bit extended floats) are not read: no framework rnnconvert " \
               "writes holds them, and narrowing them would change the weights"
    return f"weights of type {name} are not floating point"


def check(where: object, name: str, dtype: object) -> None:
    """Refuse tensor ``name`` of ``dtype`` as a recurrent parameter (:func:`refusal`).

    Raises:
        FormatError: naming the tensor and the type.
    """
    why = refusal(dtype)
    if why:
        raise FormatError(f"{where}: tensor '{name}': {why}; refused")
