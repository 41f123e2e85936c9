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
from rnnconvert.engine import matrix, registry
from rnnconvert.engine.protocol import FormatSpec
from rnnconvert.errors import FormatError

READERS = [f.name for f in registry.FORMATS if f.load().read is not None]
WRITERS = [f.name for f in registry.FORMATS if f.load().write is not None]
SNIFFED = [f.name for f in registry.FORMATS if f.load().sniff is not None]
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
        assert spec.target_forward is not None and spec.route
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
    assert [f.name for f in registry._sniffed(head, out)] == [READ_AS.get(name, name)]
    assert registry.detect(out).name == READ_AS.get(name, name)


def test_two_sniffers_claiming_a_file_is_an_error_naming_both(tmp_path, monkeypatch):
    src = tmp_path / "a.npz"
    api.save(_ckpt(), src, "npz")
    monkeypatch.setattr(registry.get("safetensors").load(), "sniff", lambda head, path: True)
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
