"""rnnconvert's own TensorFlow bundle reader (rnnconvert/formats/tf/bundle_read.py) against TensorFlow's
(``tf.train.load_checkpoint``) as the oracle: every key of every TF fixture bit-equal, the object graph as
TF's protobuf classes decode it, TF-written checkpoints of every plain dtype, strings, several shards and
tensors large enough for the lane-parallel crc32c; damaged copies refused with FormatError, never a crash."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import FIXTURES, ROOT, manifest

from rnnconvert import api
from rnnconvert.speed import crc32c
from rnnconvert.cli import main
from rnnconvert.errors import FormatError
from rnnconvert.formats.tf import bundle_read as tf_bundle, checkpoint_read as tf_checkpoint, table_read as tf_table
from rnnconvert.formats.tf.bundle_read import BundleReader, BundleUnsupported

PREFIXES = sorted(str(p)[: -len(".index")] for p in (FIXTURES / "tf").rglob("*.index"))


def _name(pre: str) -> str:
    return Path(pre).relative_to(FIXTURES / "tf").parts[0]


@pytest.fixture(scope="module")
def tf():
    import tensorflow as tf

    return tf


def _same_as_tensorflow(tf, pre: str, reader: BundleReader | None = None) -> int:
    ours = reader or BundleReader(pre)
    theirs = tf.train.load_checkpoint(pre)
    shapes = ours.get_variable_to_shape_map()
    assert shapes == theirs.get_variable_to_shape_map()
    dtypes = theirs.get_variable_to_dtype_map()
    for key in shapes:
        want = theirs.get_tensor(key)
        got = ours.get_tensor(key)
        if isinstance(want, bytes):
            assert got == want, key
            continue
        want = np.asarray(want)
        assert ours.get_variable_to_dtype_map()[key] == np.dtype(dtypes[key].as_numpy_dtype), key
        assert got.dtype == want.dtype and got.shape == want.shape, key
        if got.dtype.kind == "O":
            assert np.array_equal(got, want), key
        else:  # bit-equal (NaN payloads, -0.0 included)
            assert got.tobytes() == want.tobytes() and np.array_equal(got, want), key
    return len(shapes)


@pytest.mark.parametrize("pre", PREFIXES, ids=_name)
def test_every_fixture_key_equals_tensorflow(tf, pre):
    assert _same_as_tensorflow(tf, pre) > 0
    if _name(pre) == "lstm_partitioned":  # TF1 Saver's partitioned variables: assembled from slices
        assert any(e.slices for e in BundleReader(pre).entries.values())


def test_realworld_checkpoints_equal_tensorflow(tf, dinornn):
    """Third-party TF checkpoints (DinoRNN, a TF2 checkpoint saved by its author)."""
    found = sorted(dinornn.rglob("*.index"))
    assert found
    for idx in found:
        pre = str(idx)[: -len(".index")]
        assert _same_as_tensorflow(tf, pre) > 0
        if "_CHECKPOINTABLE_OBJECT_GRAPH" in BundleReader(pre).entries:
            test_object_graph_equals_tensorflow_protobuf(tf, pre)


@pytest.mark.parametrize("pre", [p for p in PREFIXES if "_CHECKPOINTABLE_OBJECT_GRAPH" in BundleReader(p).entries],
                         ids=_name)
def test_object_graph_equals_tensorflow_protobuf(tf, pre):
    from tensorflow.core.protobuf import trackable_object_graph_pb2

    blob = tf.train.load_checkpoint(pre).get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH")
    g = trackable_object_graph_pb2.TrackableObjectGraph()
    g.ParseFromString(blob)
    want = [([(c.node_id, c.local_name) for c in n.children],
             [(a.name, a.full_name, a.checkpoint_key) for a in n.attributes]) for n in g.nodes]
    assert tf_bundle.object_graph(BundleReader(pre).get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH")) == want
    assert any(attrs for _, attrs in want)


def _canonical(ckpt):
    return {(lay.name, k, d, f): getattr(p, f) for lay in ckpt.layers for k, dirs in enumerate(lay.params)
            for d, p in enumerate(dirs) for f in ("w_ih", "w_hh", "b_ih", "b_hh", "w_hr", "peep")}


@pytest.mark.parametrize("entry", manifest("tf"), ids=lambda e: e["file"].split("/")[1])
def test_both_readers_give_the_same_checkpoint(entry, monkeypatch):
    """The pure reader and TensorFlow's (forced with RNNCONVERT_TF_READER) give bit-equal canonical layers."""
    src, opts = FIXTURES / entry["file"], entry.get("read_opts", {})
    ours = api.load(src, **opts)
    monkeypatch.setenv("RNNCONVERT_TF_READER", "tensorflow")
    theirs = api.load(src, **opts)
    assert ours.meta["reader"] == "rnnconvert.tf_bundle"
    assert theirs.meta["reader"] == "tensorflow"
    a, b = _canonical(ours), _canonical(theirs)
    assert a.keys() == b.keys()
    for k in a:
        assert (a[k] is None and b[k] is None) or (a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k])), k
    assert sorted(ours.tensors) == sorted(theirs.tensors)


def test_no_tensorflow_import_on_the_pure_path(tmp_path):
    """Reading TF1 (partitioned too), TF2 and SavedModel checkpoints, converting and verifying (numpy
    reference) never imports TensorFlow; forcing TensorFlow's reader does."""
    code = (
        "import os, sys\n"
        "from rnnconvert import api\n"
        "for f in ['lstm_cell/ckpt', 'keras_lstm_bigru/ckpt', 'keras_lstm_bigru_savedmodel', 'lstm_partitioned']:\n"
        f"    api.load({str(FIXTURES / 'tf')!r} + '/' + f)\n"
        f"api.convert({str(FIXTURES / 'tf' / 'lstm_cell' / 'ckpt')!r}, {str(tmp_path / 'a.npz')!r})\n"
        f"api.convert({str(FIXTURES / 'tf' / 'keras_lstm_bigru' / 'ckpt')!r}, {str(tmp_path / 'b.npz')!r})\n"
        "print('TF' if 'tensorflow' in sys.modules else 'NOTF')\n"
        "os.environ['RNNCONVERT_TF_READER'] = 'tensorflow'\n"
        f"api.load({str(FIXTURES / 'tf' / 'lstm_cell' / 'ckpt')!r})\n"
        "print('TF' if 'tensorflow' in sys.modules else 'NOTF')\n")
    r = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["NOTF", "TF"]


# ------------------------------------------------------------------------------ TF-written checkpoints
def _tf_checkpoint(tf, tmp_path: Path, variables: dict, **kw) -> str:
    ck = tf.train.Checkpoint(**{k: tf.Variable(v) for k, v in variables.items()})
    return ck.write(str(tmp_path / "ck"), **kw)


def test_every_plain_dtype_and_strings(tf, tmp_path):
    rng = np.random.default_rng(3)
    variables = {f"{np.dtype(t).name}": (rng.normal(size=(3, 5)) * 100).astype(t)
                 for t in (np.float16, np.float32, np.float64, np.int8, np.uint8, np.int16, np.int32, np.int64,
                           np.uint16, np.uint32, np.uint64)}
    variables["bool"] = rng.normal(size=(7,)) > 0
    variables["bfloat16"] = tf.constant(rng.normal(size=(4, 2)).astype(np.float32), dtype=tf.bfloat16)
    variables["scalar"] = np.float32(2.5)
    variables["empty"] = np.zeros((0, 4), np.float32)
    variables["strings"] = tf.constant([[b"", b"a" * 300], [b"\x00\xff", "é".encode()]])
    pre = _tf_checkpoint(tf, tmp_path, variables)
    assert _same_as_tensorflow(tf, pre) == len(variables) + 1  # + the object graph


def test_several_shards(tf, tmp_path):
    policy = tf.train.experimental.MaxShardSizePolicy(max_shard_size=2400)  # 2 tensors a shard, none split
    pre = _tf_checkpoint(tf, tmp_path, {f"v{i}": np.arange(300, dtype=np.float32) * (i + 1) for i in range(6)},
                         options=tf.train.CheckpointOptions(experimental_sharding_callback=policy))
    rd = BundleReader(pre)
    assert rd.num_shards > 2 and len({e.shard for e in rd.entries.values()}) > 2
    assert not any(e.slices for e in rd.entries.values())
    _same_as_tensorflow(tf, pre, rd)


@pytest.mark.parametrize("size", [700, 1300])
def test_tensors_split_across_shards(tf, tmp_path, size):
    """TF2's MaxShardSizePolicy splits tensors into slices stored in several shards."""
    policy = tf.train.experimental.MaxShardSizePolicy(max_shard_size=size)
    pre = _tf_checkpoint(tf, tmp_path, {f"v{i}": np.arange(300 * (i + 1), dtype=np.float32).reshape(-1, 5) - i
                                        for i in range(6)},
                         options=tf.train.CheckpointOptions(experimental_sharding_callback=policy))
    rd = BundleReader(pre)
    assert sum(len(e.slices) > 1 for e in rd.entries.values()) >= 4 and rd.num_shards > 5
    _same_as_tensorflow(tf, pre, rd)


def test_partitioned_along_a_later_axis(tf, tmp_path):
    """TF1 partitioned variables split along axis 1 (slices not contiguous in the whole tensor)."""
    rng = np.random.default_rng(7)
    want = {"a": rng.normal(size=(4, 9)).astype(np.float32), "b": rng.normal(size=(3, 10, 2))}
    with tf.Graph().as_default():
        v1 = tf.compat.v1
        vs = [v1.get_variable(k, shape=x.shape, dtype=tf.as_dtype(x.dtype), initializer=v1.zeros_initializer(),
                              partitioner=v1.fixed_size_partitioner(3, axis=1)) for k, x in want.items()]
        ops = []
        for pv, x in zip(vs, want.values()):
            off = 0
            for part in pv:  # the partitions in order along axis 1
                w = int(part.shape[1])
                ops.append(part.assign(x[:, off:off + w]))
                off += w
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            sess.run(ops)
            pre = v1.train.Saver(vs).save(sess, str(tmp_path / "ck"))
    rd = BundleReader(pre)
    assert all(len(rd.entries[k].slices) == 3 for k in want)
    _same_as_tensorflow(tf, pre, rd)
    for k, x in want.items():
        assert np.array_equal(rd.get_tensor(k), x)


def test_declined_bundle_is_read_by_tensorflow(monkeypatch):
    """A bundle the pure reader declines (here: float32 taken off its dtype table) goes to TensorFlow."""
    src = FIXTURES / "tf" / "lstm_cell" / "ckpt"
    ours = api.load(src)
    monkeypatch.setattr(tf_bundle, "DTYPES", {k: v for k, v in tf_bundle.DTYPES.items() if v != "<f4"})
    with pytest.raises(BundleUnsupported):
        BundleReader(str(src))
    theirs = api.load(src)
    assert theirs.meta["reader"] == "tensorflow" and ours.meta["reader"] == "rnnconvert.tf_bundle"
    a, b = _canonical(ours), _canonical(theirs)
    assert all((a[k] is None and b[k] is None) or np.array_equal(a[k], b[k]) for k in a)


@pytest.fixture(params=["default", "numpy"])
def crc_impl(request, monkeypatch):
    """Run a test with the C implementation of CRC-32C when one is installed (``pip install
    'rnnconvert[fast]'``), and again with the numpy fallback."""
    if request.param == "numpy":
        monkeypatch.setattr(crc32c, "_C", None)
    return request.param


def test_large_tensors_checksums(tf, tmp_path, crc_impl):
    """Tensors past the crc32c's lane-parallel threshold (TF's checksum is the oracle), odd lengths too;
    a flipped bit anywhere in one is found."""
    rng = np.random.default_rng(5)
    sizes = {"a": 600_001, "b": (1 << 20) + 3, "c": 131_072 * 4}
    pre = _tf_checkpoint(tf, tmp_path, {k: rng.integers(0, 255, n).astype(np.uint8) for k, n in sizes.items()})
    _same_as_tensorflow(tf, pre)
    data = Path(pre + ".data-00000-of-00001")
    raw = bytearray(data.read_bytes())
    e = BundleReader(pre).entries["b/.ATTRIBUTES/VARIABLE_VALUE"]
    for pos in (e.offset, e.offset + e.size // 2 + 1, e.offset + e.size - 1):
        raw[pos] ^= 0x10
        data.write_bytes(bytes(raw))
        with pytest.raises(FormatError, match="'b/.ATTRIBUTES/VARIABLE_VALUE': checksum does not match"):
            BundleReader(pre).get_tensor("b/.ATTRIBUTES/VARIABLE_VALUE")
        raw[pos] ^= 0x10


def test_ordered_code_examples_of_tensorflow():
    """The two worked examples in TensorFlow's ordered_code.cc comment (0x424242 -> f0424242, -0x800 ->
    3800); slice keys as a whole are checked by reading TF-written partitioned variables above."""
    assert tf_table._signed_increasing(0x424242) == bytes.fromhex("f0424242")
    assert tf_table._signed_increasing(-0x800) == bytes.fromhex("3800")


def test_crc32c_check_value(crc_impl):
    """The catalogued check value of CRC-32C (iSCSI, RFC 3720) and its extension property."""
    assert crc32c.value(b"123456789") == 0xE3069283
    data = np.random.default_rng(0).integers(0, 256, 3 << 20, dtype=np.uint8).tobytes()
    assert crc32c.extend(crc32c.value(data[:1000003]), data[1000003:]) == crc32c.value(data)


# ------------------------------------------------------------------------------ damaged copies
def _copy(name: str, tmp_path: Path) -> str:
    src = FIXTURES / "tf" / name
    shutil.copytree(src, tmp_path / name)
    pre = tf_checkpoint.prefix_of(tmp_path / name)
    return pre


def _read_all(pre: str) -> dict:
    rd = BundleReader(pre)
    return {k: rd.get_tensor(k) for k in rd.entries}


def _equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        (a[k] == b[k]) if isinstance(a[k], bytes) else np.array_equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("name", ["lstm_cell", "keras_lstm_bigru", "lstm_partitioned"])
def test_every_truncation_of_the_index_is_refused(name, tmp_path):
    pre = _copy(name, tmp_path)
    idx = Path(pre + ".index")
    raw = idx.read_bytes()
    for n in range(len(raw)):
        idx.write_bytes(raw[:n])
        with pytest.raises(FormatError, match="damaged TensorFlow checkpoint index"):
            BundleReader(pre)


@pytest.mark.parametrize("name", ["lstm_cell", "keras_lstm_bigru", "lstm_partitioned"])
def test_every_flipped_byte_is_refused_or_harmless(name, tmp_path):
    """A flipped byte anywhere in the .index or the .data either raises FormatError or (footer padding,
    alignment padding) changes nothing; never another exception, never different tensors."""
    pre = _copy(name, tmp_path)
    good = _read_all(pre)
    data_file = next(Path(pre).parent.glob(Path(pre).name + ".data-*"))
    refused = 0
    for path, step in ((Path(pre + ".index"), 1), (data_file, 5)):  # every 5th .data byte: time
        raw = path.read_bytes()
        for pos in range(0, len(raw), step):
            for bit in (0x01, 0x80):
                bad = bytearray(raw)
                bad[pos] ^= bit
                path.write_bytes(bytes(bad))
                try:
                    assert _equal(_read_all(pre), good), (path.name, pos, bit)
                except (FormatError, BundleUnsupported):
                    refused += 1
        path.write_bytes(raw)
    assert refused > len(raw) // step


def test_short_and_missing_data_files(tmp_path):
    pre = _copy("keras_lstm_bigru", tmp_path)
    data = Path(pre + ".data-00000-of-00001")
    raw = data.read_bytes()
    data.write_bytes(raw[:-1])
    with pytest.raises(FormatError, match="shorter than its .index says"):
        BundleReader(pre)
    data.write_bytes(raw + b"\0" * 100)  # trailing bytes are not referenced: harmless, as for TensorFlow
    _read_all(pre)
    data.unlink()
    with pytest.raises(FormatError, match="data file .* is missing"):
        BundleReader(pre)


def test_fifo_instead_of_a_file_is_refused_not_waited_on(tmp_path):
    pre = _copy("lstm_cell", tmp_path)
    data = Path(pre + ".data-00000-of-00001")
    data.unlink()
    os.mkfifo(data)
    with pytest.raises(FormatError, match="not a regular file"):
        BundleReader(pre)
    idx = Path(pre + ".index")
    idx.unlink()
    os.mkfifo(idx)
    with pytest.raises(FormatError, match="not a regular file"):
        BundleReader(pre)


def test_damaged_copy_exits_3_with_one_line(tmp_path, capsys):
    pre = _copy("lstm_cell", tmp_path)
    idx = Path(pre + ".index")
    raw = bytearray(idx.read_bytes())
    raw[len(raw) // 3] ^= 0x20
    idx.write_bytes(bytes(raw))
    assert main([str(idx), str(tmp_path / "o.pt")]) == 3
    err = capsys.readouterr().err
    assert err.startswith("rnnconvert: error: ") and err.count("\n") == 1 and "checksum does not match" in err
    assert not (tmp_path / "o.pt").exists()


@pytest.mark.parametrize("name", ["tfck_flipped_data", "tfck_truncated_index", "tfck_short_data",
                                  "tfck_index_negative_dim"])
def test_tensorflow_fallback_still_refuses_the_bad_corpus(name, monkeypatch):
    """The TensorFlow path (forced) keeps refusing the crafted files (isolated child for the aborts)."""
    monkeypatch.setenv("RNNCONVERT_TF_READER", "tensorflow")
    with pytest.raises(FormatError):
        api.load(ROOT / "tests" / "data" / "bad" / f"{name}.index")


@pytest.mark.parametrize("rows", ["contiguous", "padded", "padded_short_reads"])
def test_lazy_kernel_rows_checked_and_equal_to_tensorflow(tmp_path, monkeypatch, rows):
    """The lazy TF2 path reads kernels in row blocks (RowSource; into a buffer of contiguous rows, or of rows
    padded as ``interpreter._rows`` pads long ones, by a scatter read, also when the reads come back short):
    the streamed conversion equals the eager read of TensorFlow itself, and a flipped byte in a kernel is
    found by the block-wise crc32c before any of it is written."""
    from rnnconvert.conventions import keras_interpreter as interpreter

    tf = pytest.importorskip("tensorflow")
    monkeypatch.setattr(interpreter, "BLOCK_BYTES", 256)  # several blocks per kernel
    monkeypatch.setattr(interpreter, "PAD_MIN_ROW_BYTES", 1 << 30 if rows == "contiguous" else 0)
    if rows == "padded_short_reads":
        real = os.preadv

        def short(fd, buffers, offset):  # at most 100 bytes a call
            return real(fd, [memoryview(buffers[0]).cast("B")[:100]], offset)
        monkeypatch.setattr(tf_bundle.os, "preadv", short)
    src = tmp_path / "ck"
    shutil.copytree(FIXTURES / "tf" / "keras_lstm_bigru", src)
    pre = str(src / "ckpt")
    out = tmp_path / "out.npz"
    api.convert(src, out)
    theirs = tf.train.load_checkpoint(pre)
    got = api.load(out)
    eager = api.load(src)  # whole tensors (no row blocks)
    for lg, le in zip(got.layers, eager.layers, strict=True):
        for dg, de in zip(lg.params[0], le.params[0], strict=True):
            assert all(np.array_equal(getattr(dg, k), v) for k, v in de.arrays().items())
    lay = got.layers[0]
    key = next(k for k in theirs.get_variable_to_shape_map() if k.endswith("kernel/.ATTRIBUTES/VARIABLE_VALUE")
               and "recurrent" not in k and "layer_with_weights-0/" in k)
    kern = theirs.get_tensor(key)  # Keras (I, 4H), gates i, f, c, o
    H = lay.hidden_size
    assert np.array_equal(lay.params[0][0].w_ih[:H], kern[:, :H].T)  # gate i, turned: bit-exact
    e = BundleReader(pre).entries[key]
    rows = BundleReader(pre).rows(key)
    with pytest.raises(ValueError, match="in order"):
        rows.read_direct(np.empty((1, e.shape[1]), np.float32), np.s_[1:2], np.s_[0:1])
    data = Path(pre + ".data-00000-of-00001")
    raw = bytearray(data.read_bytes())
    raw[e.offset + e.size - 3] ^= 0x01
    data.write_bytes(bytes(raw))
    bad = tmp_path / "bad.npz"
    with pytest.raises(FormatError, match="checksum does not match"):
        api.convert(src, bad)
    assert not bad.exists()
