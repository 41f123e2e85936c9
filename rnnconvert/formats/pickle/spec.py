"""The pickle family's record: recurrent weights a project pickled as plain numpy arrays, read by
:mod:`.pickle_read` (an allow-list unpickler, then the foreign-name table :mod:`rnnconvert.core.names`). A source
format only: no writer, so no runtime of its own (verification runs the written target against the numpy
reference of the layers as read)."""

from __future__ import annotations

from ...engine.protocol import FormatSpec
from . import pickle_read

PICKLE = FormatSpec("pickle", read=pickle_read.read, read_options=("nonlinearity", "map", "cells"))
