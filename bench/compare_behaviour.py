"""Same inputs, same outputs: run one set of conversions with two checkouts of rnnconvert and compare what each
wrote (sha256 of every output file) and said (exit code, the report's lines: verdicts, notes, errors).

For a change that must not change behaviour (issue #38: the whole-model compiler moved into ``rnnconvert/whole/``)::

    python bench/compare_behaviour.py run /work/main  /tmp/cmp/main.json
    python bench/compare_behaviour.py run .           /tmp/cmp/branch.json
    python bench/compare_behaviour.py diff /tmp/cmp/main.json /tmp/cmp/branch.json

``run`` converts every case of :data:`CASES` with ``python -m rnnconvert`` in a child whose ``PYTHONPATH`` is the
checkout (so that checkout's package runs, whatever is installed), the fixtures read from that checkout; the
paths in the printed lines are replaced by their names so that two checkouts print the same text. ``diff``
prints the counts (identical files, identical verdict lines, identical exit codes) and every difference.
Whole-model conversions run tf_keras for verification: about 10-30 s each on 2 cores.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

#: (name, source under fixtures/, output name, extra CLI arguments)
CASES: list[tuple[str, str, str, list[str]]] = [
    # recurrent layers only (no whole model anywhere): fast, first
    ("cudnn_lstm-pt", "keras/cudnn_lstm.h5", "m.pt", []),
    ("cudnn_lstm-onnx", "keras/cudnn_lstm.h5", "m.onnx", []),
    ("tf1_lstm_cell-onnx", "tf/lstm_cell/ckpt", "m.onnx", []),
    ("tf1_lstm_cell-pt2", "tf/lstm_cell/ckpt", "m.pt2", []),
    ("bidi_concat-keras", "keras/bidi_lstm_concat.h5", "m.keras", []),
    # refusals of whole models (named layer, way out)
    ("refuse_lambda-onnx", "keras_whole/refuse_lambda.h5", "m.onnx", []),
    ("sm_custom-onnx", "keras_savedmodel/sm_custom", "m.onnx", []),
    # whole Keras 1/2 models (fixtures/keras_whole): ONNX graph, .pt2 program, Keras 3, emitted nn.Module
    ("multi_io-onnx", "keras_whole/whole_multi_io.h5", "m.onnx", []),
    ("multi_io-pt2", "keras_whole/whole_multi_io.h5", "m.pt2", []),
    ("multi_io-keras", "keras_whole/whole_multi_io.h5", "m.keras", []),
    ("cudnn_stack-recurrent_only", "keras_whole/whole_cudnn_stack.h5", "m.onnx", ["--recurrent-only"]),
    # issue #30 graphs (fixtures/whole_graph) and states (fixtures/whole_states), with --emit-module
    ("embed_conv_lstm-onnx", "whole_graph/whole30_embed_conv_lstm.h5", "m.onnx", []),
    ("masked_bidir-emit", "whole_graph/whole30_masked_bidir.h5", "m.pt2", ["--emit-module", "{out}/bidir_model.py"]),
    ("seq2seq-emit", "whole_states/whole_states_lstm_seq2seq.h5", "m.onnx", ["--emit-module", "{out}/s2s_model.py"]),
    # Keras 3 archives and tf_keras SavedModels written whole
    ("k3_masked_seq-onnx", "keras3_whole/k3whole_masked_seq.keras", "m.onnx", []),
    ("sm_masked_bidir_gru-onnx", "keras_savedmodel/sm_masked_bidir_gru", "m.onnx", []),
    ("sm_conv_lstm-pt2", "keras_savedmodel/sm_conv_lstm", "m.pt2", []),
    ("masked_stack-keras", "keras_whole/whole_masked_stack.h5", "m.keras", []),
    ("states_gru-onnx", "whole_states/whole_states_gru.h5", "m.onnx", []),
    ("k3_masked_text-pt2", "keras3_whole/k3whole_masked_text.keras", "m.pt2", []),
]


#: modules moved by the change compared (issue #38): a ``.pt2`` program records the module and file of the code that
#: built it (``nn_module_stack``, stack traces), so its bytes name them
MOVED = {"rnnconvert.whole.formats.torch.pt2_write": "rnnconvert.formats.torch.pt2_write",
         "rnnconvert/whole/formats/torch/pt2_write.py": "rnnconvert/formats/torch/pt2_write.py"}


def _pt2_digest(path: Path, tree: Path) -> str:
    """sha256 of a ``torch.export`` archive with what names the checkout taken out: every member but
    ``.data/serialization_id`` (derived from the rest), the checkout's path and the moved modules' names
    (:data:`MOVED`) replaced in ``models/*.json``."""
    import zipfile

    h = hashlib.sha256()
    with zipfile.ZipFile(path) as z:
        for name in sorted(z.namelist()):
            if name.endswith(".data/serialization_id"):
                continue
            data = z.read(name)
            if name.endswith(".json"):
                text = data.decode("utf-8").replace(str(tree), "<tree>")
                for new, old in MOVED.items():
                    text = text.replace(new, old)
                data = text.encode("utf-8")
            h.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    return h.hexdigest()


def _digest(path: Path, tree: Path) -> dict[str, str]:
    """sha256 of ``path``, or of every file under it (a folder output), by relative name; a ``.pt2`` archive also
    as ``<name>#normalised`` (:func:`_pt2_digest`)."""
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    out = {str(p.relative_to(path.parent)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}
    for p in files:
        if p.suffix == ".pt2":
            out[str(p.relative_to(path.parent)) + "#normalised"] = _pt2_digest(p, tree)
    return out


def run(tree: Path, out_json: Path) -> None:
    tree = tree.resolve()
    env = {**os.environ, "PYTHONPATH": str(tree)}
    results = {}
    only = os.environ.get("CASES")  # a comma-separated subset of the case names
    for name, src, dst, extra in CASES:
        if only and name not in only.split(","):
            continue
        with tempfile.TemporaryDirectory(prefix="cmp-") as tmp:
            out = Path(tmp)
            args = [a.format(out=out) for a in extra]
            cmd = [sys.executable, "-m", "rnnconvert", str(tree / "fixtures" / src), str(out / dst), *args]
            r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp, timeout=900)
            text = (r.stdout + r.stderr).replace(str(tree), "<tree>").replace(str(out), "<out>")
            text = re.sub(r"rnnconvert-[\w]{8}", "rnnconvert-<tmp>", text)
            files = {}
            for p in sorted(out.iterdir()):
                files.update(_digest(p, tree))
            results[name] = {"rc": r.returncode, "lines": text.strip().splitlines(), "files": files}
            print(f"{name}: rc {r.returncode}, {len(files)} file(s)", flush=True)
        # written after each case: a run cut short still compares the cases it did
        out_json.write_text(json.dumps({"tree": str(tree), "results": results}, indent=1))


def _verdicts(lines: list[str]) -> list[str]:
    return [ln for ln in lines if ln.strip().startswith(("verified", "FAILED", "failed", "inconclusive", "rnnconvert: error"))
            or " verdict" in ln]


def diff(a_json: Path, b_json: Path) -> int:
    a, b = json.loads(a_json.read_text())["results"], json.loads(b_json.read_text())["results"]
    same_files = same_norm = same_verdicts = same_rc = same_text = 0
    notes = []
    n_files = 0
    problems = []
    both = [name for name in a if name in b]  # a run cut short: the cases both did
    for name in both:
        x, y = a[name], b[name]
        same_rc += x["rc"] == y["rc"]
        same_text += x["lines"] == y["lines"]
        same_verdicts += _verdicts(x["lines"]) == _verdicts(y["lines"])
        for f, h in x["files"].items():
            if f.endswith("#normalised"):
                continue
            n_files += 1
            norm = f + "#normalised"
            if y["files"].get(f) == h:
                same_files += 1
            elif norm in x["files"] and x["files"][norm] == y["files"].get(norm):
                same_norm += 1
                notes.append(f"{name}: {f}: the same program; only the recorded module paths differ (MOVED)")
            else:
                problems.append(f"{name}: {f} differs ({h[:12]} vs {str(y['files'].get(f))[:12]})")
        if set(y["files"]) - set(x["files"]):
            problems.append(f"{name}: extra files {sorted(set(y['files']) - set(x['files']))}")
        if x["lines"] != y["lines"]:
            problems.append(f"{name}: printed lines differ:\n  - " + "\n  - ".join(x["lines"]) + "\n  + "
                            + "\n  + ".join(y["lines"]))
    n = len(both)
    print(f"{n} conversions: exit codes identical {same_rc}/{n}, verdict lines identical {same_verdicts}/{n}, "
          f"all printed lines identical {same_text}/{n}; output files byte-identical {same_files}/{n_files}, "
          f"identical but for recorded module paths {same_norm}/{n_files}")
    print("\n".join(notes + problems) or "no difference")
    return 1 if problems else 0


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] not in ("run", "diff"):
        sys.exit(__doc__)
    if sys.argv[1] == "run":
        run(Path(sys.argv[2]), Path(sys.argv[3]))
    else:
        sys.exit(diff(Path(sys.argv[2]), Path(sys.argv[3])))
