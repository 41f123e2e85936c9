"""Keras 3 files: ``.keras`` archives and ``.weights.h5`` weight files (read and write).

Layout (LAYOUTS.md §6; keras 3.15 ``src/saving/saving_lib.py``, ``src/layers/layer.py``):

* ``.keras`` = zip of ``metadata.json``, ``config.json`` (the serialized model) and
  ``model.weights.h5``; a ``.weights.h5`` file is that HDF5 store alone.
* In the HDF5 store a layer's variables are datasets ``vars/0, vars/1, ...``; groups are named by
  snake_case class name made unique in order (``layers/lstm``, ``layers/gru_1``), the user name is
  the attribute ``@name`` of the layer's ``vars`` group. RNN layer: ``cell/vars/{0,1,2}`` =
  kernel ``(I, G*H)``, recurrent kernel ``(H, G*H)``, bias; ``Bidirectional``:
  ``forward_layer/cell/vars``, ``backward_layer/cell/vars``; nested models ``layers/<x>/layers/...``.
* Gate columns and bias shapes are Keras 2's (LSTM i,f,c,o, one bias; GRU z,r,h, bias ``(2, 3H)``
  with ``reset_after``, ``(3H,)`` without): ``gates.TABLE['keras']`` / ``['keras_ra']``.
* ``hard_sigmoid`` in a Keras 3 config means ``clip(x/6 + 1/2, 0, 1)`` (read as ``hard_sigmoid_k3``),
  not Keras 2's ``clip(0.2x + 0.5, 0, 1)``: a Keras-2 hard_sigmoid layer is refused for this target.
* tf_keras 2.13+ writes ``.keras`` archives of the same layout (``metadata.json`` ``keras_version``
  ``2.x``, no ``@name`` attributes): groups are then matched to config layers by their store key
  (snake_case class name made unique in config order), and ``hard_sigmoid`` keeps the Keras 2 meaning.
* A ``.weights.h5`` has no config: activations are Keras 3's defaults (``gate_activation=`` overrides),
  GRU ``reset_after`` follows the bias shape, and layers come in class-name order.

Reading never runs Keras: the zip is checked (no absolute or ``..`` member names, bounded sizes and
compression ratio), ``config.json`` is parsed with :mod:`json` and the weights with h5py.
Writing builds the model in Keras 3 (``import keras``) and saves it with ``model.save`` /
``model.save_weights``; the layout of the model is that of :mod:`.h5_write` (one ``Input``
per recurrent layer, stacked layers ``<name>_l<k>``, ``return_sequences=True``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import zipfile
import zlib
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from ...safety import guard, keras_sanitize
from ...engine import refusal
from ...errors import FormatError
from ...core.model import Checkpoint, Cell, RNNLayer
from ...conventions import keras_interpreter as interpreter, keras_names as naming
from . import h5_access, h5_read, h5_write, keras_config
from .sniff import HDF5_MAGIC, ZIP_MAGIC

ROUTE = "keras 3"
HARD_SIGMOID_SCALE = keras_config.HARD_SIGMOID_SCALE  # Keras-2 hard_sigmoid(x) = Keras-3 hard_sigmoid(1.2 x)
MAX_MEMBER_BYTES = 1 << 34  # 16 GiB: no real RNN checkpoint is larger
MAX_RATIO = 200  # uncompressed / compressed per member (HDF5 weights barely compress)
MAX_CONFIG_BYTES = 64 << 20
_K3_ACTS = {"sigmoid": "sigmoid", "tanh": "tanh", "relu": "relu", "linear": "linear", "softsign": "softsign",
            "hard_sigmoid_k3": "hard_sigmoid", "hard_sigmoid": "hard_sigmoid"}  # Keras 2's: weights rescaled
_CLASS_OF = naming.K3_STORE_CLASS


#: Import Keras 3 (:func:`.keras_config.import_keras3`).
keras3 = keras_config.import_keras3


# --------------------------------------------------------------------------------------------
# Detection and safe reading
# --------------------------------------------------------------------------------------------


def _safe_member(z: zipfile.ZipFile, name: str, path: Path) -> zipfile.ZipInfo:
    """The member ``name`` after checking the whole archive: no absolute or ``..`` names, no duplicate
    names, at most 10000 members, no member over 16 GiB or expanding more than 200x from over 1 MiB.

    Raises:
        FormatError: naming the offending member.
    """
    infos = z.infolist()
    if len(infos) > 10000:
        raise FormatError(f"{path}: {len(infos)} zip members; a Keras archive has a handful")
    names = [i.filename for i in infos]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise FormatError(f"{path}: refusing zip with a duplicated member name {dup!r}")
    for info in infos:
        n = info.filename
        if n.startswith(("/", "\\")) or ".." in n.replace("\\", "/").split("/") or ":" in n.split("/")[0]:
            raise FormatError(f"{path}: refusing zip member with an unsafe name {n!r}")
    try:
        info = z.getinfo(name)
    except KeyError:
        raise FormatError(f"{path}: not a Keras 3 archive: member '{name}' is missing") from None
    if info.file_size > MAX_MEMBER_BYTES or (
            info.file_size > (1 << 20) and info.file_size > MAX_RATIO * max(info.compress_size, 1)):
        raise FormatError(f"{path}: refusing member '{name}': {info.file_size} bytes from "
                          f"{info.compress_size} compressed (zip bomb?)")
    return info


def _copy_limited(src, dst, limit: int, where: str) -> None:
    total = 0
    while True:
        chunk = src.read(1 << 20)
        if not chunk:
            return
        total += len(chunk)
        if total > limit:
            raise FormatError(f"{where}: expands beyond its declared size; refusing")
        dst.write(chunk)


def _vars(group) -> list[np.ndarray]:
    """``vars/0, vars/1, ...`` of a Keras 3 object group, in index order."""
    if naming.K3_VARS not in group:
        return []
    v = group[naming.K3_VARS]
    keys = sorted((k for k in v.keys() if k.isdigit()), key=int)
    return [h5_access.read_dataset(v[k], f"{group.name}/vars/{k}") for k in keys]


def _user_name(group, fallback: str) -> str:
    if naming.K3_VARS in group:
        n = h5_access.attr_str(group[naming.K3_VARS], "name")
        if n:
            return n
    return fallback


def _class_of(key: str) -> str | None:
    base = key.rstrip("0123456789").rstrip("_") if key[-1:].isdigit() else key
    return _CLASS_OF.get(base)


def _snake(cls: str) -> str:
    """Keras' ``naming.to_snake_case`` of a class name (``SimpleRNN`` -> ``simple_rnn``)."""
    s1 = re.sub(r"(.)([A-Z][a-z]+)", r"\1_\2", cls)
    return re.sub(r"([a-z])([A-Z])", r"\1_\2", s1).lower()


def _layer_configs(cfg: dict | None) -> dict[str, dict]:
    """``{name: {'class_name', 'config'}}`` of the layers of a serialized model, under both the user name
    and the store key (snake_case class name made unique in order: ``gru``, ``gru_1``; keras
    ``saving_lib._save_container_state``), since tf_keras-written stores carry no ``@name``."""
    inner = cfg.get("config") if isinstance(cfg, dict) else None
    layers = inner.get("layers") if isinstance(inner, dict) else None
    if not isinstance(layers, list):
        return {}
    out: dict[str, dict] = {}
    used: dict[str, int] = {}
    for rec in layers:
        if not (isinstance(rec, dict) and isinstance(rec.get("config"), dict)
                and isinstance(rec["config"].get("name"), str) and isinstance(rec.get("class_name"), str)):
            continue
        key = _snake(rec["class_name"])
        if key in used:
            used[key] += 1
            key = f"{key}_{used[key]}"
        else:
            used[key] = 0
        out.setdefault(rec["config"]["name"], rec)
        out.setdefault(f"\0{key}", rec)
    return out


_STUB = naming.CELL_NAME


def _walk(rd, container, cfgs: dict[str, dict], prefix: str) -> None:
    if "layers" not in container:
        return
    order = {n: i for i, n in enumerate(cfgs)}

    def rank(key: str):
        base = key.rstrip("0123456789")
        num = int(key[len(base):] or -1)
        return (order.get(f"\0{key}", len(order)), base.rstrip("_"), num)

    for key in sorted(container["layers"].keys(), key=rank):
        g = container["layers"][key]
        rec = cfgs.get(f"\0{key}", {})
        name = _user_name(g, rec.get("config", {}).get("name") or key)
        rec = cfgs.get(name, rec)
        cfg = rec.get("config")
        cls = rec.get("class_name") or _class_of(key)
        # the store's structure decides what a group is; the config only adds semantics
        if "layers" in g:
            _walk(rd, g, _layer_configs(rec), f"{prefix}{name}.")
        elif "forward_layer" in g or "backward_layer" in g:
            _expect(cls, "Bidirectional", rd.path, name)
            if "forward_layer/cell" not in g or "backward_layer/cell" not in g:
                raise FormatError(f"{rd.path}: Bidirectional '{name}' lacks forward_layer/cell or "
                                  "backward_layer/cell in its weights store")
            fw, bw = _vars(g["forward_layer/cell"]), _vars(g["backward_layer/cell"])
            base = naming.WEIGHTS
            names = ([f"{name}/forward_rnn/{b}" for b in base[: len(fw)]]
                     + [f"{name}/backward_rnn/{b}" for b in base[: len(bw)]])
            rd.entry(interpreter.LayerEntry(name, names, fw + bw, cfg if cls == "Bidirectional" else None,
                                     "Bidirectional"), prefix)
        elif "cell" in g:
            cls = cls if cls in _STUB else _expect(cls, None, rd.path, name)
            w = _vars(g["cell"])
            names = [f"{name}/{_STUB.get(cls, 'cell')}/{b}" for b in naming.WEIGHTS][: len(w)]
            rd.entry(interpreter.LayerEntry(name, names, w, cfg if cls else None, cls), prefix)
        else:
            w = _vars(g)
            if "layer" in g and not w:  # TimeDistributed
                w = _vars(g["layer"])
                inner = interpreter.as_record((cfg or {}).get("layer"))
                cls = inner["class_name"] or cls
            if not w:
                continue
            base = {"Dense": list(naming.DENSE_WEIGHTS), "Embedding": list(naming.EMBEDDING_WEIGHTS)}.get(cls, [f"var{i}" for i in range(len(w))])
            rd.other(interpreter.LayerEntry(name, base[: len(w)], w), f"{prefix}{name}", cls)


def _expect(cls: str | None, want: str | None, path: str, name: str) -> None:
    """Refuse a config class that contradicts the store's structure (``want=None``: any RNN class)."""
    ok = cls is None or cls == want or (want is None and cls in _STUB) or cls not in (set(_STUB) | {"Bidirectional"})
    if not ok:
        raise FormatError(f"{path}: config says layer '{name}' is a {cls}, but its weights store "
                          f"holds a {want or 'recurrent layer'}; the archive is inconsistent")


def _read_store(path: Path, h5path: str, config: dict | None, gate_activation: str | None,
                keras_version: str | None) -> Checkpoint:
    """Read the HDF5 store ``h5path`` as :func:`rnnconvert.formats.keras.h5_read.read` reads HDF5: in a forked
    child under a deadline (libhdf5 can loop forever on a damaged file; :mod:`rnnconvert.safety.guard`), a
    large store only probed there and then read here."""
    args = (str(path), h5path, config, gate_activation, keras_version)
    if Path(h5path).stat().st_size <= h5_read.FULL_ISOLATION_MAX:
        return guard.isolated(_read_store_in, args, h5path, "HDF5")
    guard.isolated(h5_read.probe_path, (h5path,), h5path, "HDF5")
    return _read_store_in(*args)


def _read_store_in(path: str, h5path: str, config: dict | None, gate_activation: str | None,
                   keras_version: str | None) -> Checkpoint:
    import h5py

    try:
        f = h5py.File(h5path, "r")
    except OSError as exc:
        raise FormatError(f"{path}: not a readable HDF5 weights store ({exc})") from exc
    with f:
        try:
            h5_access.check_links(f)
            rd = interpreter.Interpreter(str(path), keras_version or "3.0.0", gate_activation)
            _walk(rd, f, _layer_configs(config), "")
        except (OSError, RuntimeError, KeyError, ValueError, TypeError, AttributeError) as exc:  # damaged store
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
            raise FormatError(f"{path}: damaged HDF5 weights store ({type(exc).__name__}: {first})") from exc
    ckpt = replace(rd.ckpt, format="keras3", meta={"path": str(path), "keras_version": keras_version})
    is_k3 = (keras_version or "3").startswith("3")  # tf_keras (2.x) writes .keras too, with Keras 2 hard_sigmoid
    for i, layer in enumerate(ckpt.layers):
        s = layer.semantics
        if not is_k3:
            ckpt.layers[i] = replace(layer, source={**layer.source, "format": "keras3"})
            continue
        acts = {a: ("hard_sigmoid_k3" if getattr(s, a) == "hard_sigmoid" else getattr(s, a))
                for a in ("gate_activation", "activation")}
        # Keras 3 semantics: verify against the numpy reference (no "raw" tensors for source_forward)
        source = {**{k: v for k, v in layer.source.items() if k != "raw"}, "format": "keras3"}
        ckpt.layers[i] = replace(layer.with_semantics(**acts), source=source)
    if not ckpt.layers:
        raise FormatError(f"{path}: no recurrent layer (LSTM, GRU, SimpleRNN) found")
    return ckpt


def read(path: str | Path, *, gate_activation: str | None = None, **_: Any) -> Checkpoint:
    """Read a Keras 3 ``.keras`` archive or ``.weights.h5`` file, without running Keras.

    Args:
        gate_activation: for ``.weights.h5`` files (no config): the gates' activation if not Keras 3's
            default ``sigmoid``.

    Returns:
        canonical layers (gate order i,f,g,o / r,z,n, ``W (G*H, in)``, dtype as stored); Dense and
        Embedding tensors in PyTorch naming.

    Raises:
        FormatError: unsafe or damaged archive, links outside the HDF5 file, bad shapes.
        UnsupportedError: activations or layers rnnconvert cannot represent.
    """
    p = Path(path)
    with open(p, "rb") as fh:
        head = fh.read(8)
    if head.startswith(HDF5_MAGIC):
        return _read_store(p, str(p), None, gate_activation, None)
    try:
        z = zipfile.ZipFile(p)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, NotImplementedError, UnicodeDecodeError) as exc:
        raise FormatError(f"{p}: neither a .keras zip archive nor an HDF5 weights file ({exc})") from exc
    try:
        return _read_zip(p, z, gate_activation)
    except (zipfile.BadZipFile, OSError, EOFError, zlib.error, NotImplementedError, UnicodeDecodeError,
            ValueError, RuntimeError) as exc:  # bad CRC, bad local headers, damaged deflate streams
        first = (str(exc).strip().splitlines() or [""])[0][:160]
        raise FormatError(f"{p}: damaged .keras archive ({type(exc).__name__}: {first})") from exc


def _read_zip(p: Path, z: zipfile.ZipFile, gate_activation: str | None) -> Checkpoint:
    with z, tempfile.TemporaryDirectory(prefix="rnnconvert-k3-") as tmp:
        info = _safe_member(z, "config.json", p)
        if info.file_size > MAX_CONFIG_BYTES:
            raise FormatError(f"{p}: config.json of {info.file_size} bytes is implausibly large")
        try:
            config = json.loads(z.read(info).decode("utf8"))
            meta = json.loads(z.read(_safe_member(z, "metadata.json", p)).decode("utf8")) \
                if "metadata.json" in z.namelist() else {}
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise FormatError(f"{p}: config.json / metadata.json is not valid JSON ({exc})") from exc
        if not isinstance(config, dict) or not isinstance(meta, dict):
            raise FormatError(f"{p}: config.json / metadata.json is a JSON {type(config).__name__ if not isinstance(config, dict) else type(meta).__name__}, "
                              "not an object; not a Keras 3 model archive")
        if "model.weights.h5" not in z.namelist():
            raise FormatError(f"{p}: archive without model.weights.h5 (npz or sharded weights are not supported)")
        winfo = _safe_member(z, "model.weights.h5", p)
        h5 = os.path.join(tmp, "weights.h5")
        with z.open(winfo) as src, open(h5, "wb") as dst:
            _copy_limited(src, dst, winfo.file_size, f"{p}: model.weights.h5")
        version = meta.get("keras_version") if isinstance(meta, dict) else None
        ckpt = _read_store(p, h5, config, gate_activation, str(version or "3.0.0"))
        note = meta.get("rnnconvert_rescaled") if isinstance(meta, dict) else None
        if isinstance(note, dict):
            ckpt.meta["rescaled"] = {"layers": [str(x) for x in note.get("layers", [])][:1000],
                                     "note": str(note.get("note", ""))[:500]}
        return ckpt


# --------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------

def refusals(layer: RNNLayer) -> list[str]:
    """What a Keras 3 LSTM/GRU/SimpleRNN cannot express about ``layer``.

    Keras-2 ``hard_sigmoid`` (``clip(0.2x+0.5)``) is expressed by Keras 3's (``clip(x/6+0.5)``) on weights
    scaled by 1.2 (:func:`rescale_plan`) where its input is linear in the layer's own weights: an LSTM's
    or GRU's gates, a GRU's or SimpleRNN's ``activation``; an LSTM's ``activation`` (it also squashes the
    cell state) is refused.
    """
    s, why = layer.semantics, h5_write.keras_structure_refusals(layer)
    for what, a in (("activation", s.activation), ("recurrent_activation", s.gate_activation)):
        if a == "hard_sigmoid":
            if what == "activation" and layer.cell is Cell.LSTM:
                why.append("activation=hard_sigmoid in its Keras 2 definition clip(0.2x+0.5) (Keras 3 redefined "
                           "'hard_sigmoid' as clip(x/6+0.5), and an LSTM's activation also squashes the cell "
                           "state, which no weight scaling reaches)")
        elif a not in _K3_ACTS:
            why.append(f"{what}={a} (no Keras 3 activation)")
    return why


def rescale_plan(layer: RNNLayer) -> keras_config.Rescale | None:
    """The Keras-2 hard_sigmoid rescale of a recurrent layer written for Keras 3 (``None``: none needed).
    Gate blocks in Keras order (LSTM i f c o, GRU z r h; see :class:`.keras_config.Rescale`)."""
    s = layer.semantics
    if layer.cell not in (Cell.LSTM, Cell.GRU):
        return keras_config.Rescale(layer.name, "SimpleRNN", all=True) if s.activation == "hard_sigmoid" else None
    g = [0, 1, 3] if layer.cell is Cell.LSTM and s.gate_activation == "hard_sigmoid" else []
    if layer.cell is Cell.GRU:
        g = ([0, 1] if s.gate_activation == "hard_sigmoid" else []) + ([2] if s.activation == "hard_sigmoid" else [])
    return keras_config.Rescale(layer.name, layer.cell.name, gates=tuple(g)) if g else None


RESCALE_NOTE = ("Keras-2 hard_sigmoid clip(0.2x+0.5) written as Keras 3's hard_sigmoid clip(x/6+0.5) on "
                "weights scaled by 1.2 (one float32 rounding per weight): rescaled, not bit-exact")


def check(ckpt: Checkpoint, *, recurrent_only: bool = False, **_: Any) -> list[str]:
    """Refuse what Keras 3 cannot express; return notes. A checkpoint read from a Keras 2 full-model HDF5
    file is written whole (:mod:`.keras_whole`): its whole config is translated (and refused by layer name)
    here already.

    Raises:
        UnsupportedError: naming the layer, the features and the way out (:func:`rnnconvert.engine.refusal.refuse`).
    """
    from . import keras_whole

    for layer in ckpt.layers:
        refusal.refuse(layer, refusals(layer), "keras3", "a Keras 3 layer")
    if recurrent_only:
        ckpt.meta["keras3_layout"] = "recurrent"  # read back by target_forward / verify_whole
    full = None if recurrent_only else keras_whole.read_full_model(ckpt)
    if full is not None:
        tr = keras_whole.translate(full)
        notes = [f"whole model written: every layer of {Path(full.path).name}, chained as in the source"] + tr.notes
        notes += [f"{p}: {RESCALE_NOTE}" for p in keras_whole.rescaled_layers(tr)]
        return notes
    notes = []
    if recurrent_only:
        notes.append("recurrent_only: only the recurrent layers are written, each with its own input")
    elif ckpt.format == "keras_h5":
        notes.append("weights-only Keras file: it holds no architecture (no chaining, no classes or activations "
                     "of the other layers), so only the recurrent layers are written")
    if ckpt.tensors:
        notes.append(f"{len(ckpt.tensors)} non-recurrent tensors are not written; only the recurrent layers are")
    for layer in ckpt.layers:
        if (layer.source.get("class_name") or "").startswith("CuDNN"):  # None: a layer read from .npz
            notes.append(f"{layer.name}: {layer.source['class_name']} becomes Keras 3 "
                         f"{'LSTM' if layer.cell is Cell.LSTM else 'GRU(reset_after=True)'} (runs on CPU and GPU)")
        if rescale_plan(layer) is not None:
            notes.append(f"{layer.name}: {RESCALE_NOTE}")
    return notes


def _make_layer(k, layer: RNNLayer, name: str):
    s = layer.semantics
    kw: dict[str, Any] = {"return_sequences": True, "activation": _K3_ACTS[s.activation], "use_bias": layer.bias,
                          "dtype": str(layer.dtype)}
    kw["name"] = name  # inside Bidirectional: copies named forward_<name> / backward_<name> (not auto-numbered)
    if not layer.bidirectional:
        if s.go_backwards:
            kw["go_backwards"] = True
    if layer.cell is Cell.LSTM:
        inner = k.layers.LSTM(layer.hidden_size, recurrent_activation=_K3_ACTS[s.gate_activation],
                              unit_forget_bias=False, **kw)
    elif layer.cell is Cell.GRU:
        inner = k.layers.GRU(layer.hidden_size, recurrent_activation=_K3_ACTS[s.gate_activation],
                             reset_after=s.reset_after, **kw)
    else:
        inner = k.layers.SimpleRNN(layer.hidden_size, **kw)
    if layer.bidirectional:
        return k.layers.Bidirectional(inner, merge_mode=s.merge_mode, name=name)
    return inner


def build(ckpt: Checkpoint, *, with_weights: bool = True):
    """The Keras 3 ``Model`` that :func:`write` saves."""
    k = keras3()
    inputs, outputs = [], []
    for layer, in_name, names in h5_write.plan(ckpt):
        inp = k.Input(shape=(None, layer.input_size), name=in_name, dtype=str(layer.dtype))
        h = inp
        for kk, nm in enumerate(names):
            lay = _make_layer(k, layer, nm)
            h = lay(h)
            if with_weights:
                from .keras_whole import rescale

                ws = [w for p in layer.params[kk] for w in h5_write.keras_weights(layer, p, False)]
                lay.set_weights(rescale(ws, rescale_plan(layer), layer.hidden_size))
        inputs.append(inp)
        outputs.extend(h if isinstance(h, (list, tuple)) else [h])
    return k.Model(inputs, outputs, name="rnnconvert")


def _weights_only(path: Path, weights_only: bool | None) -> bool:
    return weights_only if weights_only is not None else ".weights.h5" in Path(path).name.lower()


def write(ckpt: Checkpoint, path: str | Path, *, weights_only: bool | None = None, recurrent_only: bool = False,
          **_: Any) -> list[str]:
    """Write ``ckpt`` as a Keras 3 ``.keras`` archive (default) or ``.weights.h5`` (``weights_only=True``,
    or when the file name contains ``.weights.h5``).

    A checkpoint read from a Keras 1/2 full-model HDF5 file is written whole (every layer, chained as in the
    source: :mod:`.keras_whole`); ``recurrent_only=True`` (CLI ``--recurrent-only``) writes only its
    recurrent layers, each with its own input, as for every other source (e.g. a model with a custom layer
    that the whole-model translation refuses).

    Assumes :func:`check` passed (the engine calls it, once: :mod:`rnnconvert.engine.protocol`).
    """
    from . import keras_whole

    full = whole_model(ckpt, None)
    if full is not None:
        model, tr, lines = keras_whole.build(full, ckpt)
        rescaled = keras_whole.rescaled_layers(tr)
    else:
        model, lines = build(ckpt), None
        rescaled = [layer.name for layer in ckpt.layers if rescale_plan(layer) is not None]
    wo = _weights_only(Path(path), weights_only)
    with tempfile.TemporaryDirectory(prefix="rnnconvert-k3-") as tmp:
        out = os.path.join(tmp, "model.weights.h5" if wo else "model.keras")
        if wo:
            model.save_weights(out)
            shutil.copyfile(out, path)
        elif full is not None:
            keras_whole.save_model(model, out, full, tr)
            _repack(out, path, rescaled, "whole")
        else:
            model.save(out)
            _repack(out, path, rescaled, "recurrent")
    if lines is not None:
        how = ("model.load_weights(path) into the same architecture built in Keras 3" if wo
               else "keras.saving.load_model(path)")
        return lines + [f"whole model '{model.name}' ({len(model.inputs)} input(s), {len(model.outputs)} output(s)); "
                        f"{how}"]
    how = ("build the model (see docs/keras3.md) and model.load_weights(path)" if wo
           else "keras.saving.load_model(path)")
    return [f"{layer.name}: Keras 3 {naming.KERAS_CLASS[layer.cell]} layer(s) {', '.join(names)} "
            f"(input '{in_name}', return_sequences=True); {how}"
            for layer, in_name, names in h5_write.plan(ckpt)]



def whole_model(ckpt: Checkpoint, written: str | Path | None):
    """The Keras 2 full model (:func:`.keras_whole.read_full_model`) when ``ckpt`` is written (or, for
    ``written``, was written) whole: not with ``recurrent_only``, and a written ``.keras`` whose
    ``metadata.json`` says ``rnnconvert_layout: recurrent`` (or, from before the key, whose model is named
    ``rnnconvert``) holds the recurrent layers only."""
    from . import keras_whole

    if ckpt.meta.get("keras3_layout") == "recurrent":
        return None
    if written is not None:
        with open(written, "rb") as fh:
            is_zip = fh.read(4) == ZIP_MAGIC
        if is_zip:
            with zipfile.ZipFile(written) as z:
                names = z.namelist()
                meta = json.loads(z.read("metadata.json")) if "metadata.json" in names else {}
                layout = meta.get("rnnconvert_layout") if isinstance(meta, dict) else None
                if layout is None and "config.json" in names:
                    cfg = json.loads(z.read("config.json"))
                    layout = "recurrent" if (cfg.get("config") or {}).get("name") == "rnnconvert" else None
            if layout == "recurrent":
                return None
    return keras_whole.read_full_model(ckpt)


def _renumber(obj: Any, ids: dict[int, int]) -> Any:
    """Replace Keras' ``shared_object_id`` values (Python ``id()``s) by 1, 2, ... in order of first
    appearance; equal ids stay equal, so shared objects stay shared."""
    if isinstance(obj, dict):
        return {k: (ids.setdefault(v, len(ids) + 1) if k == "shared_object_id" else _renumber(v, ids))
                for k, v in obj.items()}
    if isinstance(obj, list):
        return [_renumber(v, ids) for v in obj]
    return obj


def _repack(src: str, dst: str | Path, rescaled: list[str] | None = None, layout: str | None = None) -> None:
    """Copy the archive Keras wrote with fixed member timestamps, no ``date_saved`` in ``metadata.json``
    and renumbered ``shared_object_id``s, so that the same input gives the same bytes. ``rescaled``: the
    layers whose weights were scaled for Keras-2 hard_sigmoid, recorded in ``metadata.json`` as
    ``rnnconvert_rescaled`` (Keras ignores the key; ``inspect`` shows it)."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for info in zin.infolist():
            data = zin.read(info)
            if info.filename == "metadata.json":
                meta = json.loads(data)
                meta.pop("date_saved", None)
                if layout:
                    meta["rnnconvert_layout"] = layout
                if rescaled:
                    meta["rnnconvert_rescaled"] = {"layers": rescaled, "note": RESCALE_NOTE}
                data = json.dumps(meta).encode()
            elif info.filename == "config.json":
                data = json.dumps(_renumber(json.loads(data), {})).encode()
            out = zipfile.ZipInfo(info.filename, date_time=(1980, 1, 1, 0, 0, 0))
            out.compress_type, out.external_attr = info.compress_type, info.external_attr
            zout.writestr(out, data)


def _resolve(model, name: str):
    """The layer at dotted path ``name`` (nested models: ``outer.inner``) of a whole-model file, or ``None``."""
    lay = model
    for part in name.split("."):
        try:
            lay = lay.get_layer(part)
        except (ValueError, AttributeError):
            return None
    return lay


def built_archive(k, path: str | Path, config: dict | None = None):
    """A ``.keras`` archive as a Keras 3 model, never handed to ``keras.saving.load_model`` (issue #40): its
    ``config.json`` (or ``config``, already read) rebuilt by :func:`rnnconvert.safety.keras_sanitize.model_config`
    (every class, key and value from rnnconvert's whitelist), built by ``keras.saving.deserialize_keras_object``
    (``safe_mode``), then ``model.weights.h5`` (copied out of the archive with the checks of :func:`_safe_member`)
    loaded by ``model.load_weights``: Keras 3's own variable placement, no config read from the file by Keras.
    The same model ``load_model(compile=False)`` makes (keras 3.15 ``saving_lib.load_model``: deserialize the
    config, then ``_load_state`` from the weights store, as ``load_weights`` does).

    Raises:
        FormatError: an unsafe or damaged archive, a bad config value. UnsupportedError: a class, key or object
            outside the whitelist."""
    p = Path(path)
    with zipfile.ZipFile(p) as z, tempfile.TemporaryDirectory(prefix="rnnconvert-k3-") as tmp:
        if config is None:
            info = _safe_member(z, "config.json", p)
            if info.file_size > MAX_CONFIG_BYTES:
                raise FormatError(f"{p}: config.json of {info.file_size} bytes is implausibly large")
            config = json.loads(z.read(info).decode("utf8"))
        clean = keras_sanitize.model_config(config, p)
        winfo = _safe_member(z, "model.weights.h5", p)
        local = os.path.join(tmp, "model.weights.h5")
        with z.open(winfo) as src, open(local, "wb") as dst:
            _copy_limited(src, dst, winfo.file_size, f"{p}: model.weights.h5")
        model = k.saving.deserialize_keras_object(clean, safe_mode=True)
        model.load_weights(local)
        return model


def _load(path: str | Path, ckpt: Checkpoint):
    """The written Keras 3 file as a Keras 3 model: ``.keras`` by ``keras.saving.load_model`` (safe mode),
    ``.weights.h5`` by ``load_weights`` into the model :func:`build` makes."""
    k = keras3()
    with open(path, "rb") as fh:
        is_zip = fh.read(4) == ZIP_MAGIC
    with tempfile.TemporaryDirectory(prefix="rnnconvert-k3-") as tmp:
        local = os.path.join(tmp, "model.keras" if is_zip else "model.weights.h5")
        shutil.copyfile(path, local)
        if is_zip:  # never load_model: the archive's config is rebuilt from the whitelist first (issue #40)
            return built_archive(k, local)
        from . import keras_whole

        full = whole_model(ckpt, path)
        model = keras_whole.build(full, ckpt)[0] if full is not None else build(ckpt, with_weights=False)
        model.load_weights(local)
        return model


def load(path: str | Path, ckpt: Checkpoint, name: str, k: int | None = None) -> tuple[list, bool]:
    """The Keras 3 runtime's view of a written file (:attr:`~rnnconvert.engine.protocol.FormatSpec.load`,
    :mod:`rnnconvert.runtimes.keras3`): ``(chain, whole)``, the Keras 3 layers of layer ``name`` (``k`` ``None``) or
    of its stacked layer ``k``, from the file loaded by :func:`_load`; ``whole``: a whole Keras 2 model, whose
    layer is found by its dotted path (one stacked layer: ``k`` must be ``None`` or 0).

    Raises:
        KeyError: no such layer in the written file."""
    model = _load(path, ckpt)
    if whole_model(ckpt, path) is not None:
        last = _resolve(model, name)
        if last is None or k not in (None, 0):
            raise KeyError(name)
        return [last], True
    for layer, _, names in h5_write.plan(ckpt):
        if layer.name == name:
            return [model.get_layer(nm) for nm in (names if k is None else names[k:k + 1])], False
    raise KeyError(name)



# --------------------------------------------------------------------------------------------
# The whole model of a Keras 3 archive (issue #30: whole-model .onnx / .pt2)
# --------------------------------------------------------------------------------------------

#: a Keras 3 ``MultiHeadAttention``'s sub-layer groups in the order it creates them (keras 3.15
#: ``MultiHeadAttention.build``; tf_keras stores the same weights as ``query/kernel``... in this order)
MHA_DENSE = ("query_dense", "key_dense", "value_dense", "output_dense")


def _store_weights_in(h5path: str, config: dict) -> dict[str, list[tuple[str, np.ndarray]]]:
    """Every top-level layer's variables in the store, by the layer's user name (the ``@name`` of its ``vars``
    group; keras 3.15 ``saving_lib``): ``[('var<i>', array)]`` in ``vars/<i>`` order (= ``layer.weights``), a
    TimeDistributed's from its ``layer/vars``, a nested model's layers as ``<inner>/var<i>`` (recursively);
    recurrent layers' cells are left to the canonical reader."""
    import h5py

    def by_name(container) -> dict[str, Any]:
        out = {}
        if "layers" in container:
            for key in container["layers"].keys():
                g = container["layers"][key]
                out[_user_name(g, key)] = g
        return out

    def collect(group, rec: dict) -> list[tuple[str, np.ndarray]]:
        if "layers" in group:  # a nested model
            subs = by_name(group)
            got = []
            for r in ((rec.get("config") or {}).get("layers") or []):
                n = (r.get("config") or {}).get("name") if isinstance(r, dict) else None
                if n in subs:
                    got += [(f"{n}/{wn}", a) for wn, a in collect(subs[n], r)]
            return got
        if "cell" in group or "forward_layer" in group:
            return []
        if all(k in group for k in MHA_DENSE):  # MultiHeadAttention: its four EinsumDense in creation order
            return [(f"var{i}", a) for i, a in enumerate(w for k in MHA_DENSE for w in _vars(group[k]))]
        w = _vars(group)
        if not w and "layer" in group:  # TimeDistributed
            w = _vars(group["layer"])
        return [(f"var{i}", a) for i, a in enumerate(w)]

    with h5py.File(h5path, "r") as f:
        h5_access.check_links(f)
        top = by_name(f)
        out: dict[str, list[tuple[str, np.ndarray]]] = {}
        for r in ((config.get("config") or {}).get("layers") or []):
            n = (r.get("config") or {}).get("name") if isinstance(r, dict) else None
            if isinstance(n, str) and n in top:
                out[n] = collect(top[n], r)
        return out


def read_full_model(ckpt: Checkpoint):
    """The whole model of a Keras 3 ``.keras`` archive (:class:`.keras_whole.FullModel`, ``framework='keras3'``):
    ``config.json`` as stored and every layer's variables (:func:`_store_weights_in`, read with h5py in the
    isolated child of :mod:`rnnconvert.safety.guard`); ``None`` for a ``.weights.h5`` file (no architecture), an
    archive that tf_keras wrote (``keras_version`` 2.x) or a config that is not a Sequential/Functional model.

    Raises:
        FormatError: an unsafe or damaged archive (the checks of :func:`read`).
    """
    from . import keras_whole

    path = ckpt.meta.get("path")
    if ckpt.format != "keras3" or not path or not Path(path).is_file():
        return None
    if not str(ckpt.meta.get("keras_version") or "").startswith("3"):
        return None
    p = Path(path)
    try:
        z = zipfile.ZipFile(p)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
        return None if p.open("rb").read(8).startswith(HDF5_MAGIC) else _damaged(p, exc)
    try:
        with z, tempfile.TemporaryDirectory(prefix="rnnconvert-k3-") as tmp:
            info = _safe_member(z, "config.json", p)
            if info.file_size > MAX_CONFIG_BYTES:
                raise FormatError(f"{p}: config.json of {info.file_size} bytes is implausibly large")
            config = json.loads(z.read(info).decode("utf8"))
            if not isinstance(config, dict) or config.get("class_name") not in ("Sequential", "Functional", "Model"):
                return None
            config = keras_sanitize.model_config(config, p, unknown="stub")  # the whitelist (issue #40)
            winfo = _safe_member(z, "model.weights.h5", p)
            h5 = os.path.join(tmp, "weights.h5")
            with z.open(winfo) as src, open(h5, "wb") as dst:
                _copy_limited(src, dst, winfo.file_size, f"{p}: model.weights.h5")
            weights = guard.isolated(_store_weights_in, (h5, config), h5, "HDF5")
    except (zipfile.BadZipFile, OSError, EOFError, zlib.error, NotImplementedError, UnicodeDecodeError,
            ValueError, RuntimeError, KeyError, TypeError, IndexError, AttributeError) as exc:
        _damaged(p, exc)
    return keras_whole.FullModel(str(p), config, str(ckpt.meta.get("keras_version")), weights, framework="keras3")


def _damaged(p: Path, exc: BaseException):
    first = (str(exc).strip().splitlines() or [""])[0][:160]
    raise FormatError(f"{p}: damaged .keras archive ({type(exc).__name__}: {first})") from exc
