"""The Keras-config family of the third attack corpus (issue 40): HIGH 1 (a marshalled ``Lambda`` in a whitelisted
layer's regularizer / constraint / initializer slot ran during the default conversion), MEDIUM 6 (a layer named
like an ``nn.Module`` attribute broke the emitted module) and the LOW config values (``Infinity`` in a shape, a rate
of ``10**400``, a 100,000-character name).

Every payload file is made by ``bench/fuzz/attack_keras_config.py`` (JSON and h5py only; the payload's code is
compiled, never called). Oracles: the payload's own marker file (it exists only if the code ran; checked to be
real by running the payload through the code before this fix, by hand: ``payload ran``), the documented exit
codes of ``rnnconvert/errors.py`` (3 a malformed value, 4 a refused object or key), and for MEDIUM 6 tf_keras'
saved outputs of the fixture (the renamed model computes the same function). The deserialization entry points of
tf_keras and Keras 3 are wrapped to prove that every config reaching them is a fixed point of
:mod:`rnnconvert.safety.keras_sanitize`, and that ``load_model`` is never called.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import rnnconvert  # noqa: E402
from rnnconvert.errors import FormatError, UnsupportedError  # noqa: E402
from rnnconvert.safety import keras_sanitize  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench" / "fuzz"))
import attack_keras_config as gen  # noqa: E402

TIMEOUT = 300


def cli(*args: str, tmpdir: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OPENBLAS_NUM_THREADS": "1", "TMPDIR": str(tmpdir)}
    env.pop("RNNCONVERT_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "rnnconvert", *args], capture_output=True, text=True,
                          timeout=TIMEOUT, env=env, cwd=ROOT)


def one_line(r: subprocess.CompletedProcess, code: int, says: str) -> None:
    lines = r.stderr.splitlines()
    assert r.returncode == code, r.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("rnnconvert: error: "), r.stderr[-2000:]
    assert says in lines[0], lines[0]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("keras_config")
    marker = d / "MARKER"
    files = {case: gen.payload_h5(d / f"{case}.h5", marker, case) for case, *_ in gen.PAYLOADS}
    return d, marker, files


REFUSED = [c for c, *_ in gen.PAYLOADS if not c.endswith("initializer")]
TARGETS = ["onnx", "pt2", "emit", "keras"]


def _convert(src: Path, out: Path, target: str):
    if target == "emit":
        return rnnconvert.convert(src, out / "m.onnx", emit_module=out / "m.py")
    return rnnconvert.convert(src, out / f"m.{target}")


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("case", REFUSED)
def test_payload_in_a_regularizer_or_constraint_is_refused_by_name(case, target, corpus, tmp_path):
    """A Lambda in an activity / kernel regularizer or a constraint of a Dense, LSTM, Masking, Bidirectional or the
    layer a Bidirectional wraps: refused (exit 4) naming the layer and the key, before any framework sees the
    config; nothing written; the payload never ran."""
    d, marker, files = corpus
    pytest.importorskip("torch" if target in ("pt2", "emit") else "onnx")
    with pytest.raises(UnsupportedError) as err:
        _convert(files[case], tmp_path, target)
    msg = str(err.value)
    assert "\n" not in msg and err.value.exit_code == 4
    _, _, layer, inner, slot = next(p for p in gen.PAYLOADS if p[0] == case)
    assert f"'{slot}'" in msg and layer in msg and "Lambda" in msg, msg
    assert list(tmp_path.iterdir()) == []
    assert not marker.exists()


@pytest.mark.parametrize("target", ["onnx", "emit"])
def test_payload_as_an_initializer_is_dropped_and_the_conversion_is_clean(target, corpus, tmp_path):
    """An initializer never reaches a value (every weight is set from the file): a Lambda there is dropped, the
    conversion is verified against tf_keras as usual, the payload never ran."""
    pytest.importorskip("onnxruntime")
    d, marker, files = corpus
    rep = _convert(files["lstm_kernel_initializer"], tmp_path, target)
    assert rep.verification is not None and rep.verification.ok
    assert not marker.exists()


def test_payload_cli_one_line_exit_4(corpus, tmp_path):
    """The CLI: one ``rnnconvert: error:`` line, exit 4, no DST, no marker (.pt2 and --emit-module)."""
    d, marker, files = corpus
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    r = cli("convert", str(files["lstm_activity"]), str(tmp_path / "m.pt2"), "--emit-module", str(tmp_path / "m.py"),
            tmpdir=tmp)
    one_line(r, 4, "activity_regularizer")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tmp"] and list(tmp.iterdir()) == []
    assert not marker.exists()


def test_savedmodel_payload_without_a_name_is_refused(corpus, tmp_path):
    """A tf_keras SavedModel folder whose config holds the Lambda without a ``name`` (the form the class check
    missed): refused by the SavedModel reader's sanitizer (exit 4), the payload never ran."""
    pytest.importorskip("tf_keras")
    d, marker, _ = corpus
    sm = gen.savedmodel_payload(tmp_path / "sm", marker)
    with pytest.raises(UnsupportedError) as err:
        rnnconvert.convert(sm, tmp_path / "m.onnx")
    assert "activity_regularizer" in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "m.onnx").exists() and not marker.exists()


def test_verify_and_diagnose_refuse_a_payload_dst(corpus, tmp_path):
    """``verify`` and ``diagnose`` read DST as untrusted: a Keras HDF5 DST whose LSTM carries the payload is
    refused where tf_keras would build the layer (``verify``: exit 4, one line); ``diagnose`` compares DST's
    tensors read by rnnconvert's own reader and finds them right (exit 0); the payload never ran."""
    d, marker, files = corpus
    good = tmp_path / "good.npz"
    rnnconvert.convert(gen.STACK, good, verify=None)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    one_line(cli("verify", str(good), str(files["lstm_activity"]), tmpdir=tmp), 4, "activity_regularizer")
    r = cli("diagnose", str(good), str(files["lstm_activity"]), tmpdir=tmp)
    assert r.returncode == 0 and r.stderr == "", r.stderr[-2000:]
    assert not marker.exists()


# ----------------------------------------------------------------------------------------------- LOW values

@pytest.mark.parametrize("case,says", [("inf_shape", "batch_input_shape"), ("huge_rate", "dropout"),
                                       ("long_name", "100000 characters"), ("nan_mask", "mask_value")])
def test_bad_config_values_are_one_line_exit_3(case, says, tmp_path):
    src = gen.config_value(tmp_path / f"{case}.h5", case)
    with pytest.raises(FormatError) as err:
        rnnconvert.convert(src, tmp_path / "m.onnx")
    msg = err.value.cli_message() if hasattr(err.value, "cli_message") else str(err.value)
    assert err.value.exit_code == 3 and "\n" not in msg and says in msg and len(msg) < 600, msg
    assert not (tmp_path / "m.onnx").exists()


def test_bad_config_value_cli(tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    src = gen.config_value(tmp_path / "huge.h5", "huge_rate")
    r = cli("convert", str(src), str(tmp_path / "m.onnx"), tmpdir=tmp)
    one_line(r, 3, "dropout")
    assert not (tmp_path / "m.onnx").exists()


# ----------------------------------------------------------------------------------------------- the sanitizer

def test_every_legitimate_fixture_config_is_a_fixed_point():
    """Every Keras config in fixtures/ (Keras 2.0.2 to Keras 3.15 files) comes out of the sanitizer as it went in
    (Keras 3's compile_config aside, which is never handed on), and again when sanitized twice."""
    import json
    import zipfile

    import h5py

    seen = 0
    for p in sorted((ROOT / "fixtures").rglob("*")):
        cfg = None
        if p.suffix in (".h5", ".hdf5"):
            with h5py.File(p, "r") as f:
                raw = f.attrs.get("model_config")
                cfg = json.loads(raw) if raw is not None else None
        elif p.suffix == ".keras":
            cfg = json.loads(zipfile.ZipFile(p).read("config.json"))
        if cfg is None:
            continue
        seen += 1
        got = keras_sanitize.model_config(cfg, p, unknown="stub")
        cfg = _without(cfg, "compile_config")
        if not _has_unknown(cfg):
            assert got == cfg, p
        assert keras_sanitize.model_config(got, p, unknown="stub") == got
    assert seen >= 30


def _without(obj, key: str):
    if isinstance(obj, dict):
        return {k: _without(v, key) for k, v in obj.items() if k != key}
    if isinstance(obj, list):
        return [_without(v, key) for v in obj]
    return obj


def _classes(rec: dict):
    yield rec.get("class_name")
    conf = rec.get("config")
    subs = conf if isinstance(conf, list) else conf.get("layers") if isinstance(conf, dict) else None
    for r in subs or []:
        yield from _classes(r)
    if isinstance(conf, dict):
        for key in ("layer", "backward_layer"):
            if isinstance(conf.get(key), dict):
                yield from _classes(conf[key])


def _has_unknown(cfg: dict) -> bool:
    """Whether a config holds a layer class outside the whitelist (kept as a name-only stub by the readers)."""
    return any(c not in keras_sanitize.LAYER_CLASSES and c not in keras_sanitize.CONTAINERS for c in _classes(cfg))


@pytest.mark.parametrize("value", [{"__passive_serialization__": True, "class_name": "L2", "config": {"l2": 0.1}},
                                   {"class_name": "L2", "config": {"l2": 0.1}, "module": "os"},
                                   {"class_name": "L2", "config": {"l2": 0.1}, "registered_name": "Custom>L2"},
                                   {"class_name": "L2", "config": {"l2": 0.1, "function": ["x", None, None]}}])
def test_objects_are_rebuilt_never_passed_on(value):
    """A table object is rebuilt from its known keys: ``__passive_serialization__`` is never handed on; a foreign
    ``module``/``registered_name`` or an unknown setting is refused (exit 4)."""
    cfg = {"class_name": "Sequential", "config": {"name": "s", "layers": [
        {"class_name": "Dense", "config": {"name": "d", "units": 2, "kernel_regularizer": value}}]}}
    try:
        got = keras_sanitize.model_config(cfg, "f.h5")
    except UnsupportedError as exc:
        assert "kernel_regularizer" in str(exc)
        return
    reg = got["config"]["layers"][0]["config"]["kernel_regularizer"]
    assert reg == {"class_name": "L2", "config": {"l2": 0.1}}


def test_unknown_key_is_refused_naming_layer_and_key():
    cfg = {"class_name": "Sequential", "config": {"name": "s", "layers": [
        {"class_name": "LSTM", "config": {"name": "rnn", "units": 2, "function": "x"}}]}}
    with pytest.raises(UnsupportedError) as err:
        keras_sanitize.model_config(cfg, "f.h5")
    assert "layer 'rnn' (LSTM), key 'function'" in str(err.value)


# ----------------------------------------------------------------------------------------------- entry points

class _Recorder:
    """Wraps framework deserialization entry points: records every outermost call's config, fails ``load_model``."""

    def __init__(self, monkeypatch):
        self.mp, self.calls, self.depth, self.bad = monkeypatch, [], 0, []

    def wrap(self, owner, name: str, forbidden: bool = False) -> None:
        fn = getattr(owner, name, None)
        if fn is None:
            return
        rec = self

        def wrapped(*args, **kwargs):
            if forbidden:
                rec.bad.append(f"{owner.__name__}.{name}")
                raise AssertionError(f"{name} was called")
            if rec.depth == 0:
                cfg = args[0] if args else kwargs.get("config", kwargs.get("json_string"))
                rec.calls.append(f"{owner.__name__}.{name}")
                if not _sanitized(cfg):
                    rec.bad.append(f"{owner.__name__}.{name}: {str(cfg)[:300]}")
            rec.depth += 1
            try:
                return fn(*args, **kwargs)
            finally:
                rec.depth -= 1
        self.mp.setattr(owner, name, wrapped)


def _sanitized(cfg) -> bool:
    """A config is clean when the sanitizer leaves it as it is (a model or layer record); a bare object (an
    initializer, a dtype policy, an activation name) when it is one of the sanitizer's tables."""
    if isinstance(cfg, str) and cfg in keras_sanitize.ACTIVATIONS | keras_sanitize.INIT_NAMES | keras_sanitize.DTYPES:
        return True
    if isinstance(cfg, dict) and cfg.get("class_name") in keras_sanitize.INIT_NAMES and cfg.get("config") == {} \
            and len(cfg) == 2:
        return True  # tf_keras' own form of an initializer name ('zeros' -> {'class_name': 'zeros', 'config': {}})
    if isinstance(cfg, dict) and cfg.get("class_name") in {**keras_sanitize.INITIALIZERS, **keras_sanitize.REGULARIZERS,
                                                            **keras_sanitize.CONSTRAINTS}:
        return "__passive_serialization__" not in cfg and "function" not in str(cfg)
    return keras_sanitize.is_sanitized(cfg)


def test_no_unsanitized_config_reaches_a_framework(monkeypatch, tmp_path):
    """Whole-model conversions that build models in tf_keras (the source side of .onnx / .pt2 / .keras checks, a
    written Keras HDF5 loaded back) and in Keras 3 (the translated model, a written .keras loaded back, a .keras
    source): every config given to a deserialization entry point is a fixed point of the sanitizer, and no
    ``load_model`` is ever called."""
    tfk = pytest.importorskip("tf_keras")
    k3 = pytest.importorskip("keras")
    pytest.importorskip("onnxruntime")
    rec = _Recorder(monkeypatch)
    rec.wrap(tfk.models, "load_model", forbidden=True)
    rec.wrap(tfk.saving, "load_model", forbidden=True)
    for name in ("model_from_json", "model_from_config"):
        rec.wrap(tfk.models, name)
    rec.wrap(tfk.layers, "deserialize")
    rec.wrap(tfk.utils, "deserialize_keras_object")
    rec.wrap(tfk.saving, "deserialize_keras_object")
    legacy = importlib.import_module("tf_keras.src.saving.legacy.serialization")
    rec.wrap(legacy, "deserialize_keras_object")
    rec.wrap(k3.saving, "load_model", forbidden=True)
    rec.wrap(k3.models, "load_model", forbidden=True)
    rec.wrap(k3.saving, "deserialize_keras_object")
    rec.wrap(k3.models, "model_from_json")
    rec.wrap(k3.layers, "deserialize")

    rnnconvert.convert(gen.STACK, tmp_path / "a.onnx")  # tf_keras source model
    rnnconvert.convert(gen.STACK, tmp_path / "b.keras")  # Keras 3 build + written .keras loaded back
    rnnconvert.convert(gen.STACK, tmp_path / "c.h5", verify="framework")  # written Keras HDF5 layers deserialized
    k3src = sorted((ROOT / "fixtures" / "keras3_whole").glob("*.keras"))[0]
    rnnconvert.convert(k3src, tmp_path / "d.onnx")  # a Keras 3 source built by Keras 3
    assert rec.bad == [], "\n".join(rec.bad)
    assert any("model_from_json" in c for c in rec.calls), rec.calls
    assert any(c.startswith("keras") and "deserialize_keras_object" in c for c in rec.calls), rec.calls


# ----------------------------------------------------------------------------------------------- MEDIUM 6

@pytest.mark.parametrize("name", ["training", "forward", "state_dict", "to", "eval", "__init__", "_modules"])
def test_emitted_module_with_a_module_attribute_name_loads_by_the_documented_steps(name, tmp_path):
    """A layer named like an ``nn.Module`` attribute (method, class or instance attribute, a dunder): the emitted
    module loads with the documented steps (``from m import Model; m = Model();
    m.load_state_dict(torch.load(..., weights_only=True)); m(x)``) in a fresh interpreter and computes tf_keras'
    saved outputs of the fixture (the renaming changes no value)."""
    pytest.importorskip("torch")
    from rnnconvert.whole.conventions import keras_graph
    from rnnconvert.formats.keras import keras_whole
    from rnnconvert.whole.formats.torch import module_write

    src = gen.named(tmp_path / "named.h5", name)
    ckpt = rnnconvert.load(src)
    full = keras_whole.read_full_model(ckpt)
    g = keras_graph.build(full.config, full.weights, ckpt)
    em = module_write.emit(g, src.name, "m", "m_state.pt")
    (tmp_path / "m.py").write_text(em.source)
    (tmp_path / "m_state.pt").write_bytes(module_write.state_bytes(em.state))
    z = np.load(gen.STACK.with_suffix(".npz"))
    ins = [k for k in z.files if k.startswith("in__")]
    np.save(tmp_path / "x.npy", z[ins[0]])
    script = ("import numpy as np, torch\n"
              "from m import Model\n"
              "m = Model()\n"
              "m.load_state_dict(torch.load('m_state.pt', weights_only=True))\n"
              "m.eval()\n"
              "with torch.no_grad():\n"
              "    y = m(torch.from_numpy(np.load('x.npy')))\n"
              "np.save('y.npy', y.numpy())\n")
    r = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr[-2000:]
    y, ref = np.load(tmp_path / "y.npy").astype(np.float64), z["out__0"].astype(np.float64)
    assert float(np.max(np.abs(y - ref))) <= 2e-5 * max(1.0, float(np.max(np.abs(ref))))
