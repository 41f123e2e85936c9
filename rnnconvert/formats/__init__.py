"""The format modules (one per file format, in family folders; :mod:`rnnconvert.engine.registry` lists them).

The package is also callable: ``rnnconvert.formats()`` is :func:`rnnconvert.api.formats` (the formats
rnnconvert reads and writes), since this package's name is the natural name of that function.
"""

import sys as _sys
import types as _types


class _CallablePackage(_types.ModuleType):
    def __call__(self):
        from ..api import formats

        return formats()


_sys.modules[__name__].__class__ = _CallablePackage
