"""The model is frozen and verification never changes it (issue #16, "a frozen model").

* Every model dataclass (``Semantics``, ``DirectionParams``, ``RNNLayer``, ``Checkpoint``) refuses
  assignment to a field (``dataclasses.FrozenInstanceError``).
* A lazy checkpoint holds its reader's :class:`rnnconvert.core.model.SlabSource` (an object, set when the
  checkpoint is built), never callbacks.
* A streamed conversion with verification (Keras HDF5, a TF2 object checkpoint, a TF1 checkpoint, a
  ``.pt`` file) leaves the checkpoint as it was: the same layer, params, array and ``source`` objects,
  ``source`` dicts with the same entries (``source['raw']``: the same lazily re-read mappings); and the
  source's own equations (``source_forward``) get the file's tensors as an argument while the layer's
  ``source['raw']`` still holds the reader's objects (verification used to swap plain dicts into it).

No numbers are asserted here: the conversions' correctness is the business of the framework oracles
(test_keras_fixtures, test_tf, test_pt_stream ...); what is checked is the identity of the model's parts.
"""

from __future__ import annotations

from collections.abc import Mapping

import dataclasses

import numpy as np
import pytest

import rnnconvert
from rnnconvert import api
from rnnconvert.core.model import Checkpoint, DirectionParams, RNNLayer, Semantics, SlabSource
from rnnconvert import runtimes
from rnnconvert.engine import pipeline, registry

from conftest import FIXTURES, torch_rnn


def _snapshot(ckpt: Checkpoint) -> dict:
    """Identities (and for ``source`` dicts, keys and value identities) of everything a checkpoint holds."""
    return {
        "fields": {f.name: id(getattr(ckpt, f.name)) for f in dataclasses.fields(ckpt)},
        "layers": [(id(layer), id(layer.semantics), id(layer.params), id(layer.source),
                    {key: id(v) for key, v in layer.source.items()},
                    [id(r) for r in layer.source.get("raw") or []],
                    [[(id(dirs), [(id(p), {n: id(a) for n, a in p.arrays().items()}) for p in dirs])]
                     for dirs in layer.params])
                   for layer in ckpt.layers],
        "tensors": {k: id(v) for k, v in ckpt.tensors.items()},
        "meta": dict(ckpt.meta),
    }


def _pt_source(tmp_path):
    torch = pytest.importorskip("torch")
    m = torch_rnn("LSTM", 5, 4, num_layers=2, bidirectional=True, seed=3)
    src = tmp_path / "src.pt"
    torch.save(m.state_dict(), src)
    return src


CASES = {  # source, target: each source read lazily (the target is a streaming writer)
    "keras_h5": (lambda tmp: FIXTURES / "keras" / "bidi_lstm_concat.h5", "out.pt"),
    "tf2_object": (lambda tmp: FIXTURES / "tf" / "keras_lstm_bigru", "out.pt"),
    "tf1": (lambda tmp: FIXTURES / "tf" / "lstm_peep_clip", "out.npz"),
    "pt": (_pt_source, "out.safetensors"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_verified_streamed_conversion_leaves_the_checkpoint_as_it_was(case, tmp_path, monkeypatch):
    make_src, target = CASES[case]
    src = make_src(tmp_path)
    if case.startswith("tf"):
        pytest.importorskip("tensorflow")
    got: list[Checkpoint] = []
    real_load = pipeline.load

    def load(*a, **kw):
        ckpt = real_load(*a, **kw)
        got.append(ckpt)
        before.append(_snapshot(ckpt))
        return ckpt

    before: list[dict] = []
    monkeypatch.setattr(pipeline, "load", load)  # what the conversion pipeline reads with
    spec = registry.detect(src).load()
    spec = runtimes.get(spec.equations) if spec.equations else None  # the source's own equations
    calls: list[str] = []
    if spec is not None and spec.source_forward is not None:  # the source's own equations see the file's tensors as an argument
        real_fwd = spec.source_forward

        def source_forward(layer, x, dtype=np.float64, raw=None):
            assert raw is not None, "verification passes the file's tensors"
            assert all(isinstance(r, Mapping) for r in raw)  # one mapping of the file's tensors per direction
            i = next(i for i, lay in enumerate(got[0].layers) if lay is layer)  # the checkpoint's own layer
            assert [id(r) for r in layer.source["raw"]] == before[0]["layers"][i][5]  # not swapped for dicts
            calls.append(layer.name)
            return real_fwd(layer, x, dtype, raw)
        monkeypatch.setattr(spec, "source_forward", source_forward)
        if spec.source_forward_multi is not None:  # float32 and float64 in lockstep: the same checks
            real_multi = spec.source_forward_multi

            def source_forward_multi(layer, xs, raw=None, record=None):
                assert raw is not None, "verification passes the file's tensors"
                assert all(isinstance(r, Mapping) for r in raw)
                i = next(i for i, lay in enumerate(got[0].layers) if lay is layer)
                assert [id(r) for r in layer.source["raw"]] == before[0]["layers"][i][5]
                calls.append(layer.name)
                return real_multi(layer, xs, raw, record)
            monkeypatch.setattr(spec, "source_forward_multi", source_forward_multi)
    rep = rnnconvert.convert(src, tmp_path / target, verify="reference")
    assert rep.verification is not None and rep.verification.ok
    assert len(got) == 1
    ckpt = got[0]
    if case != "tf1":  # TF1 checkpoints are read eagerly either way
        assert ckpt.lazy and isinstance(ckpt.slabs, SlabSource)
    if spec is not None and spec.source_forward is not None and case != "pt":
        assert calls, "the source side ran the source's own equations"
    assert _snapshot(ckpt) == before[0]


def test_no_callable_is_stored_in_a_checkpoint(tmp_path):
    """A lazy checkpoint's parts are data and one source object, never a function."""
    for src in (FIXTURES / "keras" / "bidi_lstm_concat.h5", FIXTURES / "tf" / "keras_lstm_bigru", _pt_source(tmp_path)):
        ckpt = rnnconvert.load(src, lazy=True)
        assert ckpt.lazy and isinstance(ckpt.slabs, SlabSource)
        for f in dataclasses.fields(ckpt):
            if f.name != "source":
                assert not callable(getattr(ckpt, f.name)), f.name
        for layer in ckpt.layers:
            assert not any(callable(v) for v in layer.source.values())
            for raw in layer.source.get("raw") or []:  # the stored tensors re-read for verification: records
                assert not any(callable(v) for v in vars(raw).values()), (src, type(raw))  # (file, locations)
        eager = ckpt.materialize()
        assert eager.slabs is None and not eager.lazy and ckpt.lazy  # a new checkpoint, the lazy one unchanged


def test_model_fields_cannot_be_assigned():
    p = DirectionParams(np.zeros((4, 2)), np.zeros((4, 1)), np.zeros(4), np.zeros(4))
    layer = RNNLayer("rnn", rnnconvert.core.model.Cell.LSTM, 2, 1, params=[[p]])
    ckpt = Checkpoint(layers=[layer])
    for obj, name, value in [(layer.semantics, "gate_activation", "hard_sigmoid"), (p, "w_ih", np.ones((4, 2))),
                             (layer, "params", []), (layer, "name", "other"), (ckpt, "layers", []),
                             (ckpt, "format", "pt"), (ckpt, "source", None)]:
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(obj, name, value)
    assert isinstance(layer.semantics, Semantics)
    changed = dataclasses.replace(layer, name="other")  # the way to change: a new object
    assert changed.name == "other" and layer.name == "rnn"


def test_keras_slab_source_is_keyed_by_position():
    """The Keras HDF5 slab source knows how to load each layer by position (layer index, direction), not by
    the ``id()`` of its placeholder arrays: a copy of the checkpoint with new placeholder objects loads the
    same slabs."""
    from rnnconvert.formats.keras import h5_read as keras_h5

    path = FIXTURES / "keras" / "bidi_lstm_concat.h5"
    ckpt = keras_h5.read(path, lazy=True)
    specs = ckpt.slabs.specs
    assert isinstance(specs, list) and len(specs) == len(ckpt.layers)
    assert [len(s) for s in specs] == [layer.num_directions for layer in ckpt.layers]
    copy = dataclasses.replace(ckpt, layers=[dataclasses.replace(layer, params=[[dataclasses.replace(p) for p in dirs]
                                                                                for dirs in layer.params])
                                             for layer in ckpt.layers])
    eager = keras_h5.read(path)
    for i, layer in enumerate(eager.layers):
        for a, b in zip(copy.slab(i, 0), layer.params[0]):
            for n, arr in b.arrays().items():
                assert np.array_equal(a.arrays()[n], arr)
