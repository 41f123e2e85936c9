"""The OpenVINO IR sniffer: an ``.xml`` whose first bytes open an IR's ``<net`` element, with its ``.bin`` beside
it, or a folder holding exactly one such ``.xml`` (what rnnconvert writes). Light: reads 256 bytes at most."""

from __future__ import annotations

import os
from pathlib import Path


def _is_ir(xml: Path) -> bool:
    with open(xml, "rb") as fh:
        head = fh.read(256)
    text = head.lstrip(b"\xef\xbb\xbf").lstrip()
    if text.startswith(b"<?xml"):
        text = text[text.find(b"?>") + 2:].lstrip()
    # a .bin of any kind claims the IR (a FIFO, a directory, a symlink out of the folder): the reader then names
    # what is wrong with it (safety/paths) instead of "unrecognised file format"
    return text.startswith(b"<net ") and os.path.lexists(xml.with_suffix(".bin"))


def openvino(head: bytes, path: Path) -> bool:
    """An IR ``.xml`` (``<net`` first after the XML declaration, ``.bin`` beside it) or a folder with one."""
    if path.is_dir():
        xmls = list(path.glob("*.xml"))
        return len(xmls) == 1 and xmls[0].is_file() and _is_ir(xmls[0])
    return path.suffix.lower() == ".xml" and path.is_file() and _is_ir(path)
