"""`rnnconvert verify SRC DST --device cuda`: a converted realworld model through cuDNN (GPU machine only)."""

from __future__ import annotations

import pytest

import rnnconvert
from rnnconvert.gpu.cudnn_check import cuda_available

needs_cuda = pytest.mark.skipif(not cuda_available(),
                                reason="needs torch.cuda.is_available() with cuDNN (no NVIDIA GPU here)")


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_textgenrnn_pt_through_cudnn_both_routes(realworld, tmp_path, dtype):
    src = realworld / "textgenrnn-reddit-cudnnlstm" / "reddit_rarepuppers_politics.hdf5"
    dst = tmp_path / "t.pt"
    rnnconvert.convert(src, dst)
    rep = rnnconvert.verify(src, dst, device="cuda", dtype=dtype)
    routes = {c.target_route for c in rep.layers}
    assert len(routes) == 2 and all("cuDNN" in r for r in routes)
    assert rep.ok, [(c.name, c.target_route, c.max_abs_err, c.tolerance) for c in rep.layers]


@pytest.mark.cuda
@needs_cuda
def test_dinornn_tf2_checkpoint_through_cudnn(dinornn, tmp_path):
    src = dinornn / "ckpt_100"
    dst = tmp_path / "g.pt"
    rnnconvert.convert(src, dst)
    assert rnnconvert.verify(src, dst, device="cuda").ok
