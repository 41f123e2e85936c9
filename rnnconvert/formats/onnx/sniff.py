"""The ONNX family's sniffer (format detection). Light on purpose: detection asks every family."""

from __future__ import annotations

from pathlib import Path


def onnx(head: bytes, path: Path) -> bool:
    """ONNX has no magic bytes: a ``.onnx`` name whose first byte is a protobuf tag of ``ModelProto``."""
    return path.suffix.lower() == ".onnx" and bool(head) and head[0] in (0x08, 0x12, 0x1a, 0x3a, 0x42)
