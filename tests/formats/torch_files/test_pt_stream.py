"""The slab-by-slab ``.pt`` writer (rnnconvert/formats/torch/pt_write.py) against ``torch.save`` itself.

Oracle: ``torch.save`` of the same state dict (torch tensors) into an open file. The streamed file must
be the same bytes, load with ``torch.load(weights_only=True)`` (with and without ``mmap``), pass zip's
own CRC check, and run in ``torch.nn`` like its source; a lazy source (placeholders + loader) must give
the same bytes as an eager one.
"""

from __future__ import annotations

import io
import zipfile
from dataclasses import replace

import numpy as np
import pytest

from rnnconvert.runtimes import torch as torch_rt
from rnnconvert.conventions import torch_state
import rnnconvert
from rnnconvert.formats.torch import pt_write as pt_writer, pt_read as torch_pt
from rnnconvert.core.model import Checkpoint, DirectionParams, placeholder
from rnnconvert.errors import OutputError

from conftest import FIXTURES, FnSlabs, torch_rnn

torch = pytest.importorskip("torch")

SOURCES = [
    FIXTURES / "keras" / "bidi_lstm_concat.h5",      # Bidirectional LSTM, Keras kernels turned
    FIXTURES / "keras" / "cudnn_gru.h5",             # CuDNNGRU: two biases
    FIXTURES / "keras" / "embedding_lstm.h5",        # carried Embedding/Dense tensors after the layers
    FIXTURES / "keras" / "lstm_nobias.h5",           # bias=False: no bias keys
    FIXTURES / "tf" / "multi_basic_lstm",            # TF1 stack with forget_bias 1.0 folded into b_ih
    FIXTURES / "tf" / "lstm_proj",                   # LSTM projection: weight_hr
]


def torch_save_bytes(ckpt: Checkpoint) -> bytes:
    buf = io.BytesIO()
    torch.save({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in torch_state.state_dict(ckpt).items()}, buf)
    return buf.getvalue()


def lazy_copy(ckpt: Checkpoint) -> Checkpoint:
    """The same checkpoint as a lazy one: placeholders, and a loader that hands out fresh copies."""
    layers = []
    for layer in ckpt.layers:
        ph = [[DirectionParams(**{n: placeholder(a.shape, a.dtype) for n, a in dp.arrays().items()}) for dp in dirs]
              for dirs in layer.params]
        layers.append(replace(layer, params=ph))
    loader = lambda i, k: [DirectionParams(**{n: a.copy() for n, a in dp.arrays().items()})  # noqa: E731
                           for dp in ckpt.layers[i].params[k]]
    return Checkpoint(layers=layers, tensors=ckpt.tensors, format=ckpt.format, meta=ckpt.meta, slabs=FnSlabs(loader))


@pytest.mark.parametrize("block", [None, 4096], ids=["default_block", "direct_io_4k"])
@pytest.mark.parametrize("src", SOURCES, ids=lambda p: p.name)
def test_streamed_pt_is_torch_save_byte_for_byte(src, block, tmp_path, monkeypatch):
    """(``direct_io_4k``: the output goes to the device in 4 KiB O_DIRECT blocks, speed/directio.py.)"""
    if block:
        from rnnconvert.speed import directio

        monkeypatch.setattr(directio, "BLOCK", block)
    ckpt = rnnconvert.load(src)
    out = tmp_path / "out.pt"
    rnnconvert.save(ckpt, out)
    assert out.read_bytes() == torch_save_bytes(ckpt)
    lazy_out = tmp_path / "lazy.pt"
    rnnconvert.save(lazy_copy(ckpt), lazy_out)
    assert lazy_out.read_bytes() == out.read_bytes()
    with zipfile.ZipFile(out) as z:
        assert z.testzip() is None  # every record's CRC-32 is right
    for mmap in (False, True):
        sd = torch.load(out, weights_only=True, mmap=mmap)
        ref = torch_state.state_dict(ckpt)
        assert list(sd) == list(ref)
        for key, arr in ref.items():
            assert np.array_equal(sd[key].numpy(), arr) and sd[key].numpy().dtype == arr.dtype


@pytest.mark.parametrize("dtype", [torch.float16, torch.float64])
def test_streamed_pt_runs_like_its_source_in_torch(dtype, tmp_path):
    mod = torch_rnn("LSTM", 5, 7, num_layers=3, bidirectional=True, proj_size=4).to(dtype)
    src = tmp_path / "src.pt"
    torch.save(mod.state_dict(), src)
    out = tmp_path / "out.pt"
    rnnconvert.convert(src, out, verify=None)
    ckpt = rnnconvert.load(src)
    assert out.read_bytes() == torch_save_bytes(ckpt)
    twin = torch.nn.LSTM(5, 7, num_layers=3, bidirectional=True, proj_size=4, batch_first=True).to(dtype)
    sd = torch.load(out, weights_only=True)  # a bare state dict's layer is named 'rnn' by the reader
    twin.load_state_dict({k.split(".", 1)[1]: v for k, v in sd.items()}, strict=True)
    x = torch.randn(2, 6, 5, dtype=dtype)
    with torch.no_grad():
        assert torch.equal(twin(x)[0], mod(x)[0])  # same weights, same kernel: the same bits


def test_a_failing_slab_leaves_no_output(tmp_path):
    src = tmp_path / "src.pt"
    torch.save(torch_rnn("GRU", 4, 6, num_layers=3).state_dict(), src)
    ckpt = lazy_copy(rnnconvert.load(src))
    good = ckpt.slabs

    def loader(i, k):
        if k == 2:
            raise rnnconvert.errors.FormatError("slab 2 is damaged")
        return good.read(i, k)

    ckpt = replace(ckpt, slabs=FnSlabs(loader))
    out = tmp_path / "out.pt"
    out.write_bytes(b"previous content")
    with pytest.raises(rnnconvert.errors.FormatError, match="slab 2"):
        rnnconvert.save(ckpt, out, force=True)
    assert out.read_bytes() == b"previous content"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.pt", "src.pt"]  # no temporary file or directory


def test_entries_need_only_shapes():
    ckpt = rnnconvert.load(SOURCES[0])
    lazy = lazy_copy(ckpt)
    assert pt_writer.entries(lazy) == [(k, v.shape, v.dtype) for k, v in torch_state.state_dict(ckpt).items()]


def test_write_behind_holds_two_slabs_and_hands_back_writer_errors(tmp_path, monkeypatch):
    """The .pt writer runs one slab behind the reading, in a thread (engine.stream.stream_write, WRITE_BEHIND):
    slab n + 2 is never read before slab n is written (two slabs alive at most), the file is still
    torch.save's bytes, and an error raised in the writer thread reaches the caller with no output left."""
    import threading

    src = tmp_path / "src.pt"
    sd = torch_rnn("LSTM", 4, 6, num_layers=5).state_dict()
    torch.save(sd, src)
    events: list = []
    real_write = pt_writer.PtStream.write_slab

    def write_slab(self, i, k, dirs):
        assert self.WRITE_BEHIND and threading.current_thread() is not threading.main_thread()
        real_write(self, i, k, dirs)
        events.append(("written", k))
    monkeypatch.setattr(pt_writer.PtStream, "write_slab", write_slab)
    ckpt = rnnconvert.load(src, lazy=True)
    good = ckpt.slabs

    def loader(i, k):
        events.append(("read", k))
        return good.read(i, k)
    ckpt = replace(ckpt, slabs=FnSlabs(loader))
    out = tmp_path / "out.pt"
    rnnconvert.save(ckpt, out)
    assert out.read_bytes() == torch_save_bytes(rnnconvert.load(src))
    for k in range(2, 5):
        assert events.index(("written", k - 2)) < events.index(("read", k))

    def failing(self, i, k, dirs):
        if k == 3:
            raise OSError(28, "No space left on device")
        real_write(self, i, k, dirs)
    monkeypatch.setattr(pt_writer.PtStream, "write_slab", failing)
    out2 = tmp_path / "out2.pt"
    with pytest.raises(OutputError, match="no space left"):  # the disk error as one line (exit 10)
        rnnconvert.save(rnnconvert.load(src, lazy=True), out2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.pt", "src.pt"]


def test_verification_runs_torch_native_kernels_and_restores_onednn(tmp_path, monkeypatch):
    """Verification's torch runs (the sequence and the one step) use torch's native CPU kernels
    (torch_rt.native_kernels: oneDNN would copy every weight into its own layout on each call, the whole cost
    of a multi-GB check); the user's setting is restored after, also when the run raises."""
    src = tmp_path / "src.pt"
    torch.save(torch_rnn("LSTM", 4, 6, num_layers=2, bidirectional=True).state_dict(), src)
    seen = []
    real = torch.nn.LSTM.forward

    def forward(self, *a, **k):
        seen.append(torch.backends.mkldnn.enabled)
        return real(self, *a, **k)
    monkeypatch.setattr(torch.nn.LSTM, "forward", forward)
    assert torch.backends.mkldnn.enabled
    rep = rnnconvert.convert(src, tmp_path / "out.pt")
    assert rep.verification.verdict == "ok"
    assert seen and not any(seen) and torch.backends.mkldnn.enabled

    def broken(self, *a, **k):
        raise RuntimeError("boom")
    monkeypatch.setattr(torch.nn.LSTM, "forward", broken)
    with pytest.raises(RuntimeError, match="boom"):
        ckpt = rnnconvert.load(src)
        torch_rt.forward(tmp_path / "out.pt", ckpt, ckpt.layers[0].name, np.zeros((1, 1, 4), np.float32), torch_pt.load)
    torch_pt.release()
    assert torch.backends.mkldnn.enabled


def test_stacked_layer_verified_one_slab_mapping_at_a_time(tmp_path):
    """The torch target side maps a stacked layer's slabs one at a time (torch_pt._mapped keyed by slab): after
    running slab 1 only slab 1's mapping is held; a one-slab layer keeps one mapping for its sequence and
    step runs."""
    src = tmp_path / "src.pt"
    torch.save(torch_rnn("GRU", 4, 6, num_layers=3).state_dict(), src)
    ckpt = rnnconvert.load(src)
    out = tmp_path / "out.pt"
    rnnconvert.save(ckpt, out)  # written by rnnconvert: the names verification looks for
    name = ckpt.layers[0].name
    x = np.zeros((1, 2, 4), np.float32)
    y0 = torch_rt.forward_slab(out, ckpt, name, 0, x, torch_pt.load)
    torch_rt.forward_slab(out, ckpt, name, 1, y0.astype(np.float32), torch_pt.load)
    assert [key[-1] for key in torch_pt._STATE] == [1]
    torch_pt.release()
    assert not torch_pt._STATE
