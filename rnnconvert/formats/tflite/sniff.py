"""The TensorFlow Lite family's sniffer (format detection). Light on purpose: detection asks every family."""

from __future__ import annotations

from pathlib import Path


def tflite(head: bytes, path: Path) -> bool:
    """A flatbuffer with the ``TFL3`` file identifier at bytes 4-8 (``tensorflow/lite/schema/schema.fbs``
    ``file_identifier "TFL3"``)."""
    return len(head) >= 8 and head[4:8] == b"TFL3"
