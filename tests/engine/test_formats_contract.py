"""Registry-driven tests: every format in :data:`rnnconvert.engine.registry.FORMATS` is tested by being
registered (docs/architecture.md "Adding a format"). Each case is generated from the registry records:

* the record is the declared contract (its name, consistent capabilities);
* bad files (empty, random bytes, a truncated real file) given to each reader with ``--from``: one
  ``FormatError`` line, nothing else;
* unknown reader/writer options are refused, naming the valid ones (API and CLI: one line, exit 2);
* sniffing: a file each writer wrote is claimed by exactly one sniffer, and two claims are an error
  naming both formats and ``--from``;
* round trip through each writer and its reader (consistency only: the oracles are the framework tests
  of each family and docs/formats.md, whose cells come from the same ``matrix.classify``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rnnconvert import api
from rnnconvert.cli import main
from rnnconvert.core.model import Cell, Checkpoint
from rnnconvert import runtimes
from rnnconvert.engine import matrix, registry
from rnnconvert.engine.protocol import FormatSpec
from rnnconvert.errors import FormatError

READERS = [f.name for f in registry.FORMATS if f.load().read is not None]
WRITERS = [f.name for f in registry.FORMATS if f.load().write is not None]
SNIFFED = [f.name for f in registry.FORMATS if f.sniff]
#: the format whose sniffer claims what a writer wrote (a TF2 object checkpoint reads as tf_checkpoint)
READ_AS = {"tf2_checkpoint": "tf_checkpoint"}


def _path(tmp: Path, name: str, stem: str = "out") -> Path:
    f = registry.get(name)
    return tmp / (stem + (f.extensions[0] if f.extensions else ""))


def _ckpt() -> Checkpoint:
    """One plain LSTM layer with gate-distinct weights, which every writer expresses."""
    return Checkpoint(layers=[matrix.gate_distinct_layer("t-lstm", Cell.LSTM)], format="test")


@pytest.mark.parametrize("name", [f.name for f in registry.FORMATS])
def test_record_is_the_declared_contract(name):
    spec = registry.get(name).load()
    assert isinstance(spec, FormatSpec) and spec.name == name
    assert spec.read is not None or spec.write is not None
    assert not spec.lazy or spec.read is not None
    assert not spec.stream or spec.write is not None
    if spec.write is not None:  # verification runs every written file in its framework
        assert spec.runtime is not None and spec.route
        assert runtimes.get(spec.runtime).forward is not None  # a registered runtime that runs the file
    for name in (spec.equations, spec.framework):  # the source side's runtimes are registered too
        assert name is None or runtimes.get(name).name == name
    assert not set(spec.read_options) & {"lazy"}, "laziness is the engine's choice, not a reader option"


@pytest.mark.parametrize("content", [b"", b"\x00" * 7, bytes(range(256)) * 4], ids=["empty", "zeros", "noise"])
@pytest.mark.parametrize("name", READERS)
def test_bad_file_is_one_format_error_line(name, content, tmp_path):
    p = _path(tmp_path, name, "bad")
    p.write_bytes(content)
    with pytest.raises(FormatError) as info:
        api.load(p, name)
    assert str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("name", [n for n in WRITERS if n in READERS])
def test_truncated_file_is_one_format_error_line(name, tmp_path):
    out = _path(tmp_path, name)
    api.save(_ckpt(), out, name)
    files = sorted(p for p in ([out] if out.is_file() else out.rglob("*")) if p.is_file() and p.stat().st_size > 16)
    big = max(files, key=lambda p: p.stat().st_size)
    big.write_bytes(big.read_bytes()[: big.stat().st_size // 2])
    with pytest.raises(FormatError) as info:
        api.load(out, name)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("name", READERS)
def test_unknown_reader_option_refused_naming_the_valid_ones(name, tmp_path):
    spec = registry.get(name).load()
    with pytest.raises(FormatError, match="takes no option 'no_such_option'") as info:
        api.load(_path(tmp_path, name), name, no_such_option=1)
    assert f"valid: {', '.join(spec.read_options) or 'none'}" in str(info.value)


@pytest.mark.parametrize("name", WRITERS)
def test_unknown_writer_option_refused_naming_the_valid_ones(name, tmp_path):
    spec = registry.get(name).load()
    out = _path(tmp_path, name)
    with pytest.raises(FormatError, match="takes no option 'no_such_option'") as info:
        api.save(_ckpt(), out, name, no_such_option=1)
    assert f"valid: {', '.join(spec.write_options) or 'none'}" in str(info.value)
    assert not out.exists()


def test_unknown_read_opt_on_the_command_line_is_one_line(tmp_path, capsys):
    src = tmp_path / "a.npz"
    api.save(_ckpt(), src, "npz")
    code = main(["inspect", str(src), "--read-opt", "no_such_option=1"])
    err = capsys.readouterr().err.strip()
    valid = ", ".join(registry.get("npz").load().read_options)
    assert code == 2 and "\n" not in err and "takes no option 'no_such_option'" in err and f"valid: {valid}" in err


@pytest.mark.parametrize("name", WRITERS)
def test_written_file_is_claimed_by_exactly_one_sniffer(name, tmp_path):
    out = _path(tmp_path, name)
    api.save(_ckpt(), out, name)
    head = out.read_bytes()[:64] if out.is_file() else b""
    if name not in READERS:  # output only (.pt2: torch.export.load unpickles): no sniffer claims it, never read
        assert registry._sniffed(head, out) == []
        return
    assert [f.name for f in registry._sniffed(head, out)] == [READ_AS.get(name, name)]
    assert registry.detect(out).name == READ_AS.get(name, name)


def test_two_sniffers_claiming_a_file_is_an_error_naming_both(tmp_path, monkeypatch):
    src = tmp_path / "a.npz"
    api.save(_ckpt(), src, "npz")
    from rnnconvert.formats.storage import sniff

    monkeypatch.setattr(sniff, "safetensors", lambda head, path: True)
    with pytest.raises(FormatError) as info:
        registry.detect(src)
    msg = str(info.value)
    assert "ambiguous" in msg and "safetensors" in msg and "npz" in msg and "--from" in msg


@pytest.mark.parametrize("name", [n for n in WRITERS if n in READERS])
def test_round_trip_through_writer_and_reader(name, tmp_path):
    """Consistency (not correctness: each family's framework tests are the oracle): what the writer wrote,
    its reader gives back bit-exact ('E') or with the one documented bias rounding ('R')."""
    layer = _ckpt().layers[0]
    got, detail = matrix.classify(layer, registry.get(name), tmp_path)
    assert got in ("E", "R"), (name, got, detail)


# ------------------------------------------------------------------ check() is decided once, by the engine
# A writer's write/open_stream assume its check passed (engine/protocol.py): the engine calls check once,
# before either. These cases spy on the record's verbs (monkeypatch), so they hold for every writer.

STREAM_WRITERS = [n for n in WRITERS if registry.get(n).load().stream]


def _spy_writer(monkeypatch, name: str, *, refuse: bool) -> list:
    """Replace ``name``'s check by a counting spy (refusing every layer when ``refuse``, else the real
    check) and, when ``refuse``, its write/open_stream by verbs that fail the test if entered."""
    from rnnconvert.engine import refusal

    spec = registry.get(name).load()
    real, calls = spec.check, []

    def check(ckpt, **opts):
        calls.append(ckpt)
        if refuse:
            refusal.refuse(ckpt.layers[0], ["a feature this spy refuses"], name, "the spy target")
        return real(ckpt, **opts) if real is not None else []

    def entered(*_a, **_k):
        raise AssertionError(f"{name}: the writer was entered after its check refused")

    monkeypatch.setattr(spec, "check", check)
    if real is not None:  # the writer's own module too: a writer calling its check again is counted
        import sys

        monkeypatch.setattr(sys.modules[real.__module__], real.__name__, check)
    if refuse:
        monkeypatch.setattr(spec, "write", entered)
        if spec.stream:
            monkeypatch.setattr(spec, "open_stream", entered)
    return calls


@pytest.mark.parametrize("name", WRITERS)
def test_every_entry_point_checks_before_the_writer(name, tmp_path, monkeypatch):
    from rnnconvert import batch
    from rnnconvert.errors import UnsupportedError

    src_dir = tmp_path / "src"
    src_dir.mkdir()
    api.save(_ckpt(), src_dir / "a.npz", "npz")  # an eager source
    api.save(_ckpt(), src_dir / "b.pt", "pt")  # a lazy source: a streaming writer streams
    calls = _spy_writer(monkeypatch, name, refuse=True)
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(UnsupportedError, match="a feature this spy refuses"):
        api.save(_ckpt(), _path(out, name, "s"), name)
    for src in ("a.npz", "b.pt"):
        with pytest.raises(UnsupportedError, match="a feature this spy refuses"):
            api.convert(src_dir / src, _path(out, name, "c"), to=name, verify=None)
    n = 3
    if registry.get(name).extensions:  # batch names outputs by extension (a folder format has none)
        res = batch.convert_tree(src_dir, tmp_path / "tree", to=name, verify=None)
        assert [r.status for r in res] == ["refused", "refused"], res
        assert not [p for p in (tmp_path / "tree").rglob("*") if p.is_file()]
        n += 2
    assert matrix.classify(_ckpt().layers[0], registry.get(name), tmp_path)[0] == "X"
    assert len(calls) == n + 1
    assert list(out.iterdir()) == []


def test_torch_modules_checks_before_building(monkeypatch):
    from rnnconvert.errors import UnsupportedError

    calls = _spy_writer(monkeypatch, "pt", refuse=True)
    from rnnconvert.runtimes import torch as torch_rt

    monkeypatch.setattr(torch_rt, "modules", lambda *_: pytest.fail("modules built after check refused"))
    with pytest.raises(UnsupportedError, match="a feature this spy refuses"):
        api.torch_modules(_ckpt())
    assert len(calls) == 1


@pytest.mark.parametrize("src", ["safetensors", "pt"], ids=["eager", "lazy"])
@pytest.mark.parametrize("name", WRITERS)
def test_check_runs_once_per_conversion(name, src, tmp_path, monkeypatch):
    if src == "pt" and name not in STREAM_WRITERS:
        pytest.skip("a lazy source into an eager writer is the eager case")
    source = tmp_path / f"src.{src}"
    api.save(_ckpt(), source, src)
    calls = _spy_writer(monkeypatch, name, refuse=False)
    api.convert(source, _path(tmp_path, name), to=name, verify=None)
    assert len(calls) == 1
    api.save(_ckpt(), _path(tmp_path, name, "saved"), name)
    assert len(calls) == 2


# -------------------------------------------------------- a run-time forget_bias is decided once, by the engine


@pytest.mark.parametrize("src_format", ["npz", "tf_checkpoint"])
@pytest.mark.parametrize("name", WRITERS)
def test_writer_gets_forget_bias_as_its_record_says(name, src_format, tmp_path, monkeypatch):
    """A TF1 run-time forget_bias (1.0) reaches every writer folded into b_ih[f] (``FormatSpec.forget_bias
    == 'fold'``: the writer sees forget_bias 0 and b_ih[f] + 1.0) or kept (``'keep'``: npz), by both routes:
    a TF1 checkpoint read with ``forget_bias=1.0`` (lazy, so streamed slab by slab into a streaming writer;
    read whole for the others) and an ``.npz`` that keeps forget_bias (read whole: the eager route of the
    streaming writers)."""
    from rnnconvert.core.transforms import fold_forget_bias

    if src_format == "npz" and name not in STREAM_WRITERS:
        pytest.skip("the TF1 source is the eager route of an eager writer")
    layer = matrix.gate_distinct_layer("fb_lstm", Cell.LSTM, two_bias=False, forget_bias=1.0)
    src = _path(tmp_path, src_format, "src")
    api.save(Checkpoint(layers=[layer], format="test"), src, src_format)
    opts = {"forget_bias": 1.0} if src_format == "tf_checkpoint" else {}
    source = api.load(src, **opts)
    assert source.layers[0].semantics.forget_bias == 1.0
    spec = registry.get(name).load()
    seen: list = []
    real_write, real_open = spec.write, spec.open_stream

    def write(ckpt, path, **o):
        seen.extend((lay.semantics.forget_bias, lay.params[0][0].b_ih.copy()) for lay in ckpt.layers)
        return real_write(ckpt, path, **o)

    def open_stream(ckpt, path, **o):
        w = real_open(ckpt, path, **o)
        inner = w.write_slab

        def write_slab(i, k, dirs):
            seen.append((ckpt.layers[i].semantics.forget_bias, dirs[0].b_ih.copy()))
            return inner(i, k, dirs)

        w.write_slab = write_slab
        return w

    monkeypatch.setattr(spec, "write", write)
    if spec.stream:
        monkeypatch.setattr(spec, "open_stream", open_stream)
    api.convert(src, _path(tmp_path, name), to=name, verify=None, read_opts=opts)
    want = source.layers[0] if spec.forget_bias == "keep" else fold_forget_bias(source.layers[0])
    assert len(seen) == 1
    assert seen[0][0] == want.semantics.forget_bias
    assert np.array_equal(seen[0][1], want.params[0][0].b_ih)
    assert source.layers[0].semantics.forget_bias == 1.0  # the engine's view never changes the checkpoint
