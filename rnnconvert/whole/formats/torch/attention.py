"""Keras ``Attention`` / ``AdditiveAttention`` (:func:`keras_attention`) and ``MultiHeadAttention``
(:func:`keras_mha`) at inference as torch functions (issue #41), used by the ``.pt2``
program (:mod:`.pt2_write`) and written, as its source, into emitted modules (:mod:`.module_write`): one
definition of the equations for both.

Equations (tf_keras 2.21 ``layers/attention/attention.py``, ``additive_attention.py``,
``base_dense_attention.py``; keras 3.15 ``layers/attention/``, the same numbers), ``q`` ``(B, Tq, D)``, ``v``
``(B, Tv, Dv)``, ``k`` ``(B, Tv, D)`` (``v`` when not given):

* scores ``(B, Tq, Tv)``: ``dot``: ``q @ k^T`` (times ``scale`` when ``use_scale``); ``concat``:
  ``concat_score_weight * sum(tanh(scale * (q_i + k_j)), -1)`` (``scale`` only when ``use_scale``);
  ``additive``: ``sum(scale * tanh(q_i + k_j), -1)`` (``scale`` ``(D,)``, 1 without ``use_scale``);
* a step ``j`` the value mask hides, or ``j > i`` under the causal mask, scores ``s - 1e9`` computed in float32
  (as Keras does in float32: for a row where every step is hidden, the rounding of ``s - 1e9`` is what Keras'
  softmax sees, whatever dtype this runs in);
* ``w = softmax(scores, -1)`` (dropout is training only), output ``w @ v``, zero where the query mask hides a
  step; ``w`` is what ``return_attention_scores`` returns.

Oracle: tf_keras' and Keras 3's outputs in ``tests/formats/whole_models/test_whole_attention.py``.
"""

from __future__ import annotations


def keras_attention(q, v, k, q_mask, v_mask, causal: bool, mode: str, scale, concat_weight):
    """Keras attention (module docstring). ``q_mask`` ``(B, Tq)`` / ``v_mask`` ``(B, Tv)`` bool or ``None``;
    ``mode`` ``'dot'``, ``'concat'`` or ``'additive'``; ``scale`` / ``concat_weight`` tensors or ``None``.
    Returns ``(output (B, Tq, Dv), weights (B, Tq, Tv))`` in the inputs' dtype."""
    import torch

    if mode == "dot":
        scores = q @ k.transpose(-1, -2)
        if scale is not None:
            scores = scores * scale
    else:
        t = q.unsqueeze(-2) + k.unsqueeze(-3)
        if mode == "additive":
            t = torch.tanh(t)
            scores = (t * scale).sum(-1) if scale is not None else t.sum(-1)
        else:
            scores = concat_weight * torch.tanh(t * scale if scale is not None else t).sum(-1)
    keep = None
    if v_mask is not None:
        keep = v_mask.unsqueeze(-2)
    if causal:
        rows = torch.arange(scores.shape[-2], device=scores.device).unsqueeze(-1)
        tri = rows >= torch.arange(scores.shape[-1], device=scores.device).unsqueeze(0)
        keep = tri if keep is None else keep & tri
    if keep is not None:
        scores = torch.where(keep, scores, (scores.float() - 1e9).to(scores.dtype))
    w = torch.softmax(scores, -1)
    out = w @ v
    if q_mask is not None:
        out = out * q_mask.unsqueeze(-1).to(out.dtype)
    return out, w


def keras_mha(q, v, k, q_mask, v_mask, k_mask, causal: bool, masked: str, wq, bq, wk, bk, wv, bv, wo, bo):
    """Keras ``MultiHeadAttention`` at inference (issue #41; tf_keras 2.21 / keras 3.15
    ``layers/attention/multi_head_attention.py``, the default ``attention_axes``): ``q`` ``(B, Tq, Dq)``, ``v``
    ``(B, Tv, Dv)``, ``k`` ``(B, Tv, Dk)``; masks bool ``(B, T)`` or ``None``; weights as
    :func:`rnnconvert.whole.conventions.keras_graph.mha_weights` orders them (``Wq (Dq, H, K)``, ``bq (H, K)``...,
    ``Wo (H, V, O)``, ``bo (O,)``).

    Projections ``x @ W + b`` per head; scores ``(B, H, Tq, Tv)`` = ``(q' / sqrt(K)) . k'``; a pair is hidden where
    the query's, the value's or the key's mask hides a step or (``causal``) ``j > i``; ``masked`` says how
    (``keras_graph._mha``): ``'add'`` ``s - 1e9`` in float32, ``'fill'`` ``-1e9``, ``'zero'`` ``-1e9`` and the
    weight then 0; ``w = softmax(scores, -1)``; output ``(w @ v')`` through ``Wo`` plus ``bo``. Returns
    ``(output (B, Tq, O), w (B, H, Tq, Tv))`` in the inputs' dtype."""
    import torch

    qp = torch.einsum("btd,dnh->btnh", q, wq) + bq
    kp = torch.einsum("bsd,dnh->bsnh", k, wk) + bk
    vp = torch.einsum("bsd,dnh->bsnh", v, wv) + bv
    qp = qp * (1.0 / float(wq.shape[-1]) ** 0.5)
    scores = torch.einsum("bsnh,btnh->bnts", kp, qp)
    keep = None
    if q_mask is not None:
        keep = q_mask[:, None, :, None]
    for m in (v_mask, k_mask):
        if m is not None:
            keep = m[:, None, None, :] if keep is None else keep & m[:, None, None, :]
    if causal:
        rows = torch.arange(scores.shape[-2], device=scores.device).unsqueeze(-1)
        tri = rows >= torch.arange(scores.shape[-1], device=scores.device).unsqueeze(0)
        keep = tri if keep is None else keep & tri
    if keep is not None:
        hidden = (scores.float() - 1e9).to(scores.dtype) if masked == "add" else torch.full_like(scores, -1e9)
        scores = torch.where(keep, scores, hidden)
    w = torch.softmax(scores, -1)
    if keep is not None and masked == "zero":
        w = torch.where(keep, w, torch.zeros_like(w))
    out = torch.einsum("bnts,bsnh->btnh", w, vp)
    return torch.einsum("btnh,nho->bto", out, wo) + bo, w
