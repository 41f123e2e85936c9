"""Generators of the third attack corpus's path families (issue 40, HIGH 2 and 3, OpenVINO's LOW items): multi-file
sources whose side files lead out of the folder, are not regular files, or would be looked up in the working
directory; OpenVINO XML that hides a DTD in UTF-16 or writes numbers in other scripts' digits. Each function
builds its case from a committed fixture (made by the framework: ``fixtures/openvino``, ``fixtures/orbax``,
``fixtures/tf``, ``fixtures/keras_savedmodel``) copied into the folder it is given, and returns what to convert.
Nothing here is committed as data: ``tests/security/test_source_paths.py`` regenerates every case under a
temporary folder; ``python bench/fuzz/attack_paths.py OUTDIR`` writes the corpus for a manual run.

``secret(path, n)`` writes the "outside" file: ``n`` bytes of distinctive finite float32 values (read as weights
they would pass every check), whose first 64 bytes must never appear in any output.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "fixtures"


def secret(path: Path, n: int = 4096) -> Path:
    """An outside file of ``n`` bytes of distinctive float32 values (the ``~/.ssh/id_rsa`` of these tests)."""
    k = (n + 3) // 4
    path.write_bytes((np.arange(k, dtype=np.float32) * 0.001 + 0.4321).tobytes()[:n])
    return path


# ------------------------------------------------------------------------------------------------ OpenVINO


def openvino_copy(folder: Path, stem: str = "torch_lstm") -> Path:
    """A copy of the IR fixture ``stem`` as ``folder/model.xml`` + ``model.bin``; returns the folder."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(FIXTURES / "openvino" / f"{stem}.xml", folder / "model.xml")
    shutil.copy(FIXTURES / "openvino" / f"{stem}.bin", folder / "model.bin")
    return folder


def openvino_bin_outside(folder: Path, outside: Path, stem: str = "torch_lstm") -> Path:
    """HIGH 2: ``model.bin -> <outside>``: a secret file as large as the real ``.bin`` (so every constant fits)."""
    openvino_copy(folder, stem)
    size = (folder / "model.bin").stat().st_size
    secret(outside, size)
    (folder / "model.bin").unlink()
    (folder / "model.bin").symlink_to(outside)
    return folder


def openvino_xml_outside(folder: Path, elsewhere: Path, stem: str = "torch_lstm") -> Path:
    """A folder whose one ``.xml`` is a symlink to an IR outside it (with its own ``.bin`` there)."""
    openvino_copy(elsewhere, stem)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.xml").symlink_to(elsewhere / "model.xml")
    shutil.copy(elsewhere / "model.bin", folder / "model.bin")
    return folder


def openvino_bin_special(folder: Path, kind: str, stem: str = "torch_lstm") -> Path:
    """``model.bin`` a FIFO (``kind='fifo'``: a reader opening it blocks for ever) or a directory (``'dir'``)."""
    openvino_copy(folder, stem)
    (folder / "model.bin").unlink()
    if kind == "fifo":
        os.mkfifo(folder / "model.bin")
    else:
        (folder / "model.bin").mkdir()
    return folder


def openvino_utf16_dtd(folder: Path, stem: str = "torch_lstm", encoding: str = "utf-16") -> Path:
    """LOW: the IR re-encoded in UTF-16 (with its byte-order mark) with a DTD declaring nested entities, one of
    them used in a layer's name: a byte test for ``<!DOCTYPE`` misses it, expat expands it."""
    openvino_copy(folder, stem)
    text = (folder / "model.xml").read_text("utf-8")
    text = text[text.index("?>") + 2:] if text.startswith("<?xml") else text
    dtd = ('<!DOCTYPE net [<!ENTITY a "AAAAAAAAAAAAAAAA"><!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;">'
           '<!ENTITY c "&b;&b;&b;&b;&b;&b;&b;&b;">]>')
    text = f'<?xml version="1.0" encoding="{encoding.upper()}"?>{dtd}' + text.replace('name="', 'name="&c;', 1)
    (folder / "model.xml").write_bytes(text.encode(encoding))
    return folder


def openvino_unicode_digits(folder: Path, stem: str = "torch_lstm", digits: str = "\u0660\u0661\u0662\u0663\u0664"
                            "\u0665\u0666\u0667\u0668\u0669") -> Path:
    """LOW: every ``offset="N"`` of the IR written in another script's digits (Arabic-Indic by default), which
    Python's ``int`` reads as N."""
    import re

    openvino_copy(folder, stem)
    text = (folder / "model.xml").read_text("utf-8")
    text = re.sub(r'offset="([0-9]+)"', lambda m: 'offset="' + "".join(digits[int(c)] for c in m.group(1)) + '"',
                  text)
    (folder / "model.xml").write_text(text, "utf-8")
    return folder


# ------------------------------------------------------------------------------------------------- Orbax


def orbax_plain(folder: Path, name: str = "flax") -> Path:
    """The Orbax fixture ``name`` (OCDBT, written by Orbax) as the other layout Orbax writes (``use_ocdbt=False``):
    one zarr v2 folder per leaf, ``<folder>/<leaf>/.zarray`` + raw (uncompressed) chunks, each array copied by
    tensorstore from the fixture's store; ``_METADATA`` the fixture's with ``use_ocdbt`` false. Needs tensorstore."""
    import json

    import tensorstore as ts

    src = FIXTURES / "orbax" / name
    meta = json.loads((src / "_METADATA").read_text())
    folder.mkdir(parents=True, exist_ok=True)
    base = {"driver": "ocdbt", "base": src.resolve().as_uri() + "/"}
    for entry in meta["tree_metadata"].values():
        leaf = ".".join(str(k["key"]) for k in entry["key_metadata"])
        a = ts.open({"driver": "zarr", "kvstore": {**base, "path": f"{leaf}/"}}, open=True).result().read().result()
        out = ts.open({"driver": "zarr", "kvstore": {"driver": "file", "path": str(folder.resolve() / leaf) + "/"},
                       "metadata": {"compressor": None, "shape": list(a.shape), "chunks": list(a.shape) or [],
                                    "dtype": np.asarray(a).dtype.str}, "create": True}).result()
        out.write(a).result()
    meta["use_ocdbt"] = False
    (folder / "_METADATA").write_text(json.dumps(meta))
    for extra in ("_CHECKPOINT_METADATA", "commit_success.txt"):
        if (src / extra).exists():
            shutil.copy(src / extra, folder / extra)
    return folder


def orbax_leaves(folder: Path) -> list[Path]:
    """The leaf folders (holding ``.zarray``) of a plain Orbax folder, sorted."""
    return sorted(p.parent for p in folder.rglob(".zarray"))


def _chunks(leaf: Path) -> list[Path]:
    return sorted(p for p in leaf.iterdir() if p.name != ".zarray")


def orbax_chunk_outside(folder: Path, outside: Path, name: str = "flax") -> Path:
    """HIGH 3: a plain Orbax folder whose first leaf's chunk file is a symlink to a secret file of the same size
    (raw chunks: its bytes would be the weights)."""
    orbax_plain(folder, name)
    chunk = _chunks(orbax_leaves(folder)[0])[0]
    secret(outside, chunk.stat().st_size)
    chunk.unlink()
    chunk.symlink_to(outside)
    return folder


def orbax_leaf_outside(folder: Path, elsewhere: Path, name: str = "flax") -> Path:
    """HIGH 3: a plain Orbax folder whose first leaf folder is a symlink to a folder outside (a copy of the leaf
    whose chunks hold secret bytes)."""
    orbax_plain(folder, name)
    leaf = orbax_leaves(folder)[0]
    shutil.copytree(leaf, elsewhere)
    for c in _chunks(elsewhere):
        secret(c, c.stat().st_size)
    shutil.rmtree(leaf)
    leaf.symlink_to(elsewhere, target_is_directory=True)
    return folder


def orbax_ocdbt_data_outside(folder: Path, outside: Path, name: str = "flax") -> Path:
    """An OCDBT Orbax folder (the fixture) whose data files under ``d/`` are symlinks to copies outside."""
    shutil.copytree(FIXTURES / "orbax" / name, folder)
    outside.mkdir(parents=True, exist_ok=True)
    for f in sorted(folder.rglob("*")):
        if f.parent.name == "d" and f.is_file():
            shutil.copy(f, outside / f.name)
            f.unlink()
            f.symlink_to(outside / f.name)
    return folder


def orbax_item_outside(folder: Path, elsewhere: Path, name: str = "flax") -> Path:
    """A ``CheckpointManager``-shaped step folder whose one item folder (``default``) is a symlink to a checkpoint
    outside it."""
    shutil.copytree(FIXTURES / "orbax" / name, elsewhere)
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(elsewhere / "_CHECKPOINT_METADATA", folder / "_CHECKPOINT_METADATA")  # as a manager's step has
    (folder / "default").symlink_to(elsewhere, target_is_directory=True)
    return folder


def orbax_chunk_fifo(folder: Path, name: str = "flax") -> Path:
    """A plain Orbax folder whose first chunk file is a FIFO (tensorstore would block opening it)."""
    orbax_plain(folder, name)
    chunk = _chunks(orbax_leaves(folder)[0])[0]
    chunk.unlink()
    os.mkfifo(chunk)
    return folder


def orbax_decoys(cwd: Path, ckpt: Path) -> Path:
    """HIGH 3: a working directory holding, under the same leaf names as the plain checkpoint ``ckpt``, zarr
    arrays of other values (the checkpoint's plus 0.5): read relative to the working directory, these would be
    the weights. Returns ``cwd``."""
    for leaf in orbax_leaves(ckpt):
        rel = leaf.relative_to(ckpt)
        shutil.copytree(leaf, cwd / rel)
        for c in _chunks(cwd / rel):
            a = np.frombuffer(c.read_bytes(), np.float32)
            c.write_bytes((a + np.float32(0.5)).astype(np.float32).tobytes())
    return cwd


# ------------------------------------------------------------------------------------- ONNX and TensorFlow


def onnx_external_outside(folder: Path, outside: Path) -> Path:
    """An ONNX LSTM whose external data file ``model.data`` is a symlink to a secret file outside the folder, as
    large as the real data (every offset fits)."""
    sys.path.insert(0, str(Path(__file__).parent))
    import attack_corpus2

    model = attack_corpus2.onnx_external_symlink(folder)
    real = folder / "real" / "weights.bin"
    secret(outside, real.stat().st_size)
    (folder / "model.data").unlink()
    (folder / "model.data").symlink_to(outside)
    real.unlink()
    (folder / "real").rmdir()
    return model


def onnx_external_fifo(folder: Path) -> Path:
    """An ONNX LSTM whose external data file is a FIFO."""
    sys.path.insert(0, str(Path(__file__).parent))
    import attack_corpus2

    model = attack_corpus2.onnx_external_symlink(folder)
    (folder / "model.data").unlink()
    os.mkfifo(folder / "model.data")
    return model


def tf_special(folder: Path, which: str, fixture: Path = FIXTURES / "tf" / "bidi_lstm") -> Path:
    """A copy of TF checkpoint folder ``fixture`` whose ``.index`` (``which='index'``) or data shard (``'data'``)
    is a FIFO."""
    shutil.copytree(fixture, folder)
    for p in sorted(folder.iterdir()):
        if (which == "index" and p.name.endswith(".index")) or (which == "data" and ".data-" in p.name):
            p.unlink()
            os.mkfifo(p)
    return folder


def tf_state_outside(folder: Path, outside: Path, fixture: Path = FIXTURES / "tf" / "bidi_lstm") -> Path:
    """A copy of TF checkpoint folder ``fixture`` whose ``checkpoint`` state file is a symlink to a file outside
    (naming the folder's own prefix, so that following it would work)."""
    shutil.copytree(fixture, folder)
    outside.write_bytes((folder / "checkpoint").read_bytes())
    (folder / "checkpoint").unlink()
    (folder / "checkpoint").symlink_to(outside)
    return folder


def savedmodel_metadata_outside(folder: Path, elsewhere: Path,
                                fixture: Path = FIXTURES / "keras_savedmodel" / "sm_masked_bidir_gru") -> Path:
    """A tf_keras SavedModel folder whose ``keras_metadata.pb`` is a symlink to a copy outside it."""
    shutil.copytree(fixture, folder)
    elsewhere.mkdir(parents=True, exist_ok=True)
    shutil.copy(folder / "keras_metadata.pb", elsewhere / "keras_metadata.pb")
    (folder / "keras_metadata.pb").unlink()
    (folder / "keras_metadata.pb").symlink_to(elsewhere / "keras_metadata.pb")
    return folder


# ---------------------------------------------------------------------------------------------- main


if __name__ == "__main__":  # pragma: no cover - a manual run
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "attack_paths")
    out.mkdir(parents=True, exist_ok=True)
    o = out / "outside"
    o.mkdir(exist_ok=True)
    openvino_bin_outside(out / "ir_bin_outside", o / "ir_secret.bin")
    openvino_xml_outside(out / "ir_xml_outside", o / "ir_elsewhere")
    openvino_bin_special(out / "ir_bin_fifo", "fifo")
    openvino_bin_special(out / "ir_bin_dir", "dir")
    openvino_utf16_dtd(out / "ir_utf16_dtd")
    openvino_unicode_digits(out / "ir_unicode_digits")
    onnx_external_outside(out / "onnx_data_outside", o / "onnx_secret.bin")
    onnx_external_fifo(out / "onnx_data_fifo")
    tf_special(out / "tf_index_fifo", "index")
    tf_special(out / "tf_data_fifo", "data")
    tf_state_outside(out / "tf_state_outside", o / "tf_state")
    savedmodel_metadata_outside(out / "savedmodel_metadata_outside", o / "savedmodel_elsewhere")
    try:
        import tensorstore  # noqa: F401
    except ImportError:
        print("tensorstore is not installed: the Orbax cases are left out")
    else:
        orbax_plain(out / "orbax_plain")
        orbax_chunk_outside(out / "orbax_chunk_outside", o / "orbax_secret.bin")
        orbax_leaf_outside(out / "orbax_leaf_outside", o / "orbax_leaf")
        orbax_ocdbt_data_outside(out / "orbax_ocdbt_data_outside", o / "orbax_d")
        orbax_chunk_fifo(out / "orbax_chunk_fifo")
        orbax_item_outside(out / "orbax_item_outside", o / "orbax_item")
        (out / "orbax_decoy_cwd").mkdir(exist_ok=True)
        orbax_decoys(out / "orbax_decoy_cwd", out / "orbax_plain")
    print(f"wrote the path corpus under {out}")
