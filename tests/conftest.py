"""Shared test helpers: paths to fixtures and to the third-party files in fixtures/realworld."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
#: ``RNNCONVERT_CUDA_TESTS=1`` runs the tests marked ``cuda`` on the GPU (docs/gpu-validation.md); otherwise the
#: suite hides GPUs (TensorFlow and torch would both take one), and those tests skip saying so
CUDA_TESTS = os.environ.get("RNNCONVERT_CUDA_TESTS") == "1"
if not CUDA_TESTS:
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
REALWORLD = FIXTURES / "realworld"
#: Unlicensed third-party files that are not redistributed here (fixtures/realworld/README.md): only
#: where the shared collection sits beside the checkout.
SHARED_REALWORLD = ROOT.parent / "shared" / "realworld"


def manifest(family: str) -> list[dict]:
    path = FIXTURES / "manifest.json"
    if not path.exists():
        return []
    return json.loads(path.read_text()).get(family, [])


#: tf_keras (Keras 2) for the tests that run it, one import per module; skips where it is absent
@pytest.fixture(scope="module")
def k2():
    return pytest.importorskip("tf_keras")


#: Keras 3 for the tests that run it; skips where it is absent or not Keras 3
@pytest.fixture(scope="module")
def k3():
    k = pytest.importorskip("keras")
    if not k.__version__.startswith("3"):
        pytest.skip("needs Keras 3")
    return k


@pytest.fixture
def realworld():
    """The third-party checkpoints kept in the repository (``fixtures/realworld``)."""
    return REALWORLD


@pytest.fixture
def dinornn():
    """The DinoRNN TF2 object checkpoint: it has no license, so it is not in the repository; the tests
    that use it run where ``../shared/realworld`` sits beside the checkout and skip elsewhere."""
    d = SHARED_REALWORLD / "dinornn-gru-tf2-checkpoint"
    if not d.exists():
        pytest.skip(f"{d} is not present (unlicensed, not redistributed; see fixtures/realworld/README.md)")
    return d


def gate_distinct(rng, rows: int, cols: int, gates: int, scale: float = 0.5):
    """A ``(rows, cols)`` float32 matrix whose ``gates`` row blocks each sit in their own value range
    (block k centred on ``scale * (k - (gates-1)/2) / gates``), so any gate permutation slip shows: the fixture
    generators' filler ``centred`` of ``fixtures/_weights.py`` (:func:`fixture_script`), draw for draw."""
    return fixture_script("_weights").centred(rng, rows, cols, gates, scale)


def torch_rnn(kind: str, input_size: int, hidden: int, *, seed: int = 0, **kw):
    """A torch nn.LSTM/GRU/RNN (batch_first) whose every parameter is gate-distinct."""
    import numpy as np
    import torch

    mod = getattr(torch.nn, kind)(input_size, hidden, batch_first=True, **kw)
    rng = np.random.default_rng(seed)
    g = {"LSTM": 4, "GRU": 3, "RNN": 1}[kind]
    sd = {}
    for name, p in mod.state_dict().items():
        if p.ndim == 2:
            gg = g if p.shape[0] == g * hidden else 1
            sd[name] = torch.from_numpy(gate_distinct(rng, p.shape[0], p.shape[1], gg))
        else:
            sd[name] = torch.from_numpy(gate_distinct(rng, p.shape[0], 1, g)[:, 0])
    mod.load_state_dict(sd)
    return mod.eval()


def assert_wiring_slip_seen(mod, src, good, bad, run, input_size: int) -> None:
    """The wiring check's contract on a written file ``good`` and its edited copy ``bad`` of the torch layer ``mod``
    saved as ``src``. Oracle: ``mod`` itself on a seeded ``(3, 8, input_size)`` standard normal input;
    ``run(path, x)`` (the target's own runtime) gives it within ``1e-4`` of its scale on ``good`` and misses it by
    more than ``2e-2`` (twice rho: a slip verification must see) on ``bad``; then ``api.verify`` says ok for
    ``good`` through the whole layer's graph, and fail for ``bad`` naming the whole run."""
    import numpy as np
    import torch

    from rnnconvert import api

    x = np.random.default_rng(0).standard_normal((3, 8, input_size)).astype(np.float32)
    with torch.no_grad():
        want = mod(torch.from_numpy(x))[0].numpy()
    scale = float(np.abs(want).max())
    assert float(np.abs(run(good, x) - want).max()) < 1e-4 * scale
    assert float(np.abs(run(bad, x) - want).max()) > 2e-2 * scale  # twice rho: a slip verification must see

    ok = api.verify(src, good)
    assert ok.verdict == "ok", [(c.verdict, c.reason) for c in ok.layers]
    assert "whole layer's graph" in ok.layers[0].target_route  # the wiring ran
    rep = api.verify(src, bad)
    assert rep.verdict == "fail", [(c.verdict, c.reason) for c in rep.layers]
    assert "run whole" in rep.layers[0].reason, rep.layers[0].reason


def assert_within_float32_spread(layer, x, y, *, last_step: bool = False, what: str = "output"):
    """Assert that ``y`` -- a float32 evaluation of ``layer`` on ``x`` by code that is not ours (a
    framework, or an oracle file computed on another machine) -- is what verification would accept.

    Why not a fixed tolerance: on an ill-conditioned layer (the Mycroft GRU: ``activation='linear'``,
    inputs up to 36, outputs up to 66) two float32 evaluations of the same equations differ by up to
    ~5e-4 relative, and by how much depends on the order of operations, which the CPU's BLAS kernels
    choose (tf_keras missed a 1e-5 bound by 3.4e-2 on another CPU). So the bound is measured here, on
    this CPU, as verification's full-sequence comparison measures it
    (``rnnconvert.verify.engine.sequence_tolerance``):
    ``1e-5 * max(1, max|y64|) + 2 * max|y64 - y32|``, with ``y64`` the numpy reference
    (:func:`rnnconvert.reference.forward`) in float64 and ``y32`` the float32 evaluation farther from
    it of the two verification may use: the numpy reference in float32, and for a layer read from a
    Keras file the Keras equations on its stored tensors (``keras_math.source_forward``, Keras' order
    of operations). A layout slip (swapped gates, a dropped bias) moves the output by O(1) of its
    scale, far outside that bound (``tests/formats/keras_files/test_realworld_keras.py`` checks that it catches a 1%
    nudge).

    ``last_step``: ``y`` is the last step only (a layer with ``return_sequences=False``)."""
    import numpy as np

    from rnnconvert.core import reference
    from rnnconvert.verify import keras_equations as keras_math
    from rnnconvert.verify.engine import sequence_tolerance

    y64 = reference.forward(layer, np.asarray(x, np.float64))
    y32s = [reference.forward(layer, np.asarray(x, np.float32), np.float32)]
    if layer.source.get("raw") is not None and layer.source.get("family") == "keras":
        y32s.append(keras_math.source_forward(layer, np.asarray(x, np.float32), np.float32))
    if last_step:
        y64, y32s = y64[:, -1], [v[:, -1] for v in y32s]
    y32 = max((np.asarray(v, np.float64) for v in y32s), key=lambda v: float(np.abs(v - y64).max()))
    tol = sequence_tolerance(y64, y32, 1e-5)
    err = float(np.abs(np.asarray(y, np.float64) - y64).max())
    assert err <= tol, (f"{what} of '{layer.name}' differs from the float64 reference by {err:.3g}, "
                        f"more than verification's bound {tol:.3g}")
    return err, tol


#: Tests marked ``slow`` in one place. ``pytest -m "not slow"`` is the quick tier (README "Running the tests"):
#: every test under about 1 s of CPU, and of each format family at least one read + write + verify against the
#: family's framework (:data:`QUICK`); ``pytest`` runs everything and stays the CI command. Listed here: single
#: tests (or a function's every case) measured at 1 s of CPU or more in the quick tier (session 16) or 3 s of
#: wall time in a full run (`pytest --durations=100`, earlier sessions), mostly building tf_keras / Keras 3 models,
#: starting the CLI in a child process or running many conversions; whole modules in :data:`SLOW_MODULES`. A new
#: slow test may also carry ``@pytest.mark.slow`` itself.
SLOW = (
    "tests/security/test_kill.py::test_sigkill_at_random_moments_leaves_dst_intact",
    "tests/formats/keras_files/test_keras3.py::test_keras2_model_to_keras3_and_back",
    "tests/formats/keras_files/test_keras3.py::test_go_backwards_merge_sum_and_dtypes",
    "tests/formats/keras_files/test_keras3.py::test_malformed_config_never_crashes",
    "tests/formats/keras_files/test_keras3.py::test_tf_keras_written_keras_archive",
    "tests/formats/keras_files/test_keras3.py::test_textgenrnn_cudnnlstm_to_keras3",
    "tests/formats/keras_files/test_keras3.py::test_pytorch_to_keras3",
    "tests/formats/keras_files/test_keras3.py::test_outputs_are_byte_stable",
    "tests/formats/keras_files/test_keras3.py::test_keras3_hard_sigmoid_is_read_as_keras3",
    "tests/engine/test_matrix.py::test_support_matrix_is_current_and_consistent",
    "tests/engine/test_any_to_any.py::test_pair[[]*-keras_h5[]]",
    "tests/engine/test_any_to_any.py::test_pair[[]*-keras3[]]",
    "tests/engine/test_any_to_any.py::test_pair[[]*-tf2_checkpoint[]]",
    "tests/engine/test_any_to_any.py::test_two_hops_equal_one*",
    "tests/formats/keras_files/test_keras_stream.py::test_stream_file_is_what_model_save_writes*",
    "tests/formats/keras_files/test_keras_stream.py::test_stream_written_file_runs_in_tf_keras*",
    "tests/formats/keras_files/test_keras_stream.py::test_template_subprocess_equals_in_process",
    "tests/formats/keras_files/test_keras_stream.py::test_target_forward_slab_chains_to_target_forward",
    "tests/formats/keras_files/test_keras_stream.py::test_one_slab_alive_and_nothing_left_on_failure",
    "tests/formats/keras_files/test_keras_stream.py::test_target_side_sees_a_damaged_layer*",
    "tests/formats/keras_files/test_keras_h5_write.py::test_torch_to_keras2_h5*",
    "tests/formats/keras_files/test_keras_h5_write.py::test_textgenrnn_to_keras2_h5_both_forms",
    "tests/formats/keras_files/test_keras_h5_write.py::test_keras2_roundtrip_cudnn_and_reset_before",
    "tests/engine/test_stream.py::test_every_lazy_reader_into_every_stream_writer[[]*-keras_h5[]]",
    "tests/cli/test_guides.py::test_guide_runs*",
    "tests/formats/tf_files/test_tf_bundle.py::test_every_flipped_byte_is_refused_or_harmless*",
    "tests/formats/tf_files/test_tf_bundle.py::test_no_tensorflow_import_on_the_pure_path",
    "tests/formats/tf_files/test_tf.py::test_framework_forward_equals_oracle",
    "tests/formats/torch_files/test_pt_zip.py::test_more_than_65535_records",
    "tests/formats/torch_files/test_pt_zip.py::test_every_fixture_written_as_pt_is_torch_save",
    "tests/cli/test_cli.py::test_batch_directory",
    "tests/security/test_bad_inputs.py::test_tensorflow_abort_is_contained_to_one_line",
    "tests/security/test_bad_inputs.py::test_output_bytes_are_deterministic*",
    # session 15, tests/engine not-slow --durations under a load of about 12 (seconds of wall time): the traced
    # conversions 71-111 s each but tf1-onnx (15 s), the pt2 contract cases (torch.export) 13-51 s
    "tests/engine/test_architecture.py::test_a_traced_conversion*[[]keras-*",
    "tests/engine/test_architecture.py::test_a_traced_conversion*[[]pt-safetensors[]]",
    "tests/engine/test_formats_contract.py::*[[]pt2*",
    # session 15, tests/performance + tests/security not-slow (interrupted after 77 tests; same load): the plain
    # and fast backends on a Keras source 41-114 s, the termination-signal clean-ups 23-31 s each
    "tests/performance/test_speed_backend.py::test_plain_and_fast_backends_write_the_same_bytes_with_the_same_verdicts[[]keras-*",
    "tests/security/test_attack_corpus.py::test_termination_signals_clean_up*",
    # session 15, the whole quick tier (2507 s wall, 616 s CPU, load about 8): tests of 19 s or more there
    "tests/cli/test_cli_edges.py::test_tensorflow_cpp_log_lines_kept_off_stderr",
    "tests/cli/test_cli.py::test_command_line_ends_without_teardown_and_loses_no_output",
    "tests/security/test_keras_config_payload.py::test_no_unsanitized_config_reaches_a_framework",
    "tests/security/test_keras_config_payload.py::test_verify_and_diagnose_refuse_a_payload_dst",
    "tests/security/test_attack_corpus.py::test_bombs_end_with_one_line_within_the_budget[[]pt_stride0_bf16.pt[]]",
    "tests/security/test_outputs_attack.py::test_emitted_set_whole_*_at_every_step",
    "tests/verify/test_whole_verdict_stable.py::*[[]keras_bidi_gru_before[]]",
    # session 16 (issue #38's 5 minutes): every test that took 1 s of CPU or more in the measured quick tier
    # (`pytest -m "not slow"` with a per-test CPU hook: user+sys of the process and the children it reaped; 2,509
    # tests, 685 s of CPU), a function as a whole where all its cases did; and the per-file sweeps of the security
    # corpora (one case each stays in QUICK)
    "tests/cli/test_cli_edges.py::test_batch_skips_unrecognised_files_and_resumes",
    "tests/cli/test_cli_edges.py::test_emit_module_refusals_are_one_line_and_write_nothing[[]keras/lstm_weights.h5-w.py-4-holds none[]]",
    "tests/cli/test_cli_usage.py::test_a_src_starting_with_a_dash",
    "tests/cli/test_install.py::test_outputs_written_with_libraries_blocked[[]*",
    "tests/cli/test_install.py::test_verified_without_torch_and_a_broken_file_still_fails[[]*",
    "tests/cli/test_partial_models.py::test_default_writes_the_recurrent_layers_with_a_note_naming_the_layer",
    "tests/cli/test_partial_models.py::test_the_note_is_in_the_json_and_the_html_report",
    "tests/cli/test_partial_models.py::test_keras3_target_writes_the_recurrent_layers_of_a_lambda_model",
    "tests/cli/test_short_report.py::test_one_short_line_per_check_and_a_closing_line",
    "tests/cli/test_short_report.py::test_what_is_carried_beyond_the_recurrent_layers",
    "tests/engine/test_stream.py::test_restricted_reader_equals_torch_load",
    "tests/engine/test_stream.py::test_npz_stream_bytes_do_not_depend_on_laziness",
    "tests/engine/test_stream.py::test_streamed_conversions_verified_and_bit_exact[[]LSTM-kw0[]]",
    "tests/engine/test_stream.py::test_every_lazy_reader_into_every_stream_writer[[]keras_h5-pt[]]",
    "tests/engine/test_stream.py::test_every_lazy_reader_into_every_stream_writer[[]keras_h5-onnx[]]",
    "tests/engine/test_stream.py::test_every_lazy_reader_into_every_stream_writer[[]keras_h5-safetensors[]]",
    "tests/engine/test_stream.py::test_every_lazy_reader_into_every_stream_writer[[]keras_h5-npz[]]",
    "tests/formats/onnx_files/test_onnx.py::test_mycroft_gru_reproduces_oracle",
    "tests/formats/onnx_files/test_onnx.py::test_keras_only_semantics_from_onnx_refused_for_pt",
    "tests/formats/tf_files/test_tf_bundle.py::test_both_readers_give_the_same_checkpoint[[]*",
    "tests/formats/tf_files/test_tf_bundle.py::test_declined_bundle_is_read_by_tensorflow",
    "tests/formats/tf_files/test_tf_bundle.py::test_tensorflow_fallback_still_refuses_the_bad_corpus[[]*",
    "tests/formats/tf_files/test_training_state.py::test_h5_optimizer_weights_are_named_in_the_notes",
    "tests/formats/tflite_files/test_tflite_while_hard.py::test_onnx_and_pt2_reproduce_the_interpreter[[]pt2-hs_gru_dropout[]]",
    "tests/formats/tflite_files/test_tflite_while_hard.py::test_onnx_and_pt2_reproduce_the_interpreter[[]pt2-hs_gru_max[]]",
    "tests/formats/tflite_files/test_tflite_while_hard.py::test_onnx_and_pt2_reproduce_the_interpreter[[]pt2-hs_gru_ones[]]",
    "tests/formats/tflite_files/test_tflite_while_hard.py::test_onnx_and_pt2_reproduce_the_interpreter[[]pt2-hs_gru_ra_linear[]]",
    "tests/formats/tflite_files/test_tflite_while_hard.py::test_onnx_and_pt2_reproduce_the_interpreter[[]pt2-hs_gru_ra_tanh[]]",
    "tests/formats/tflite_files/test_tflite_while_hard.py::test_onnx_and_pt2_reproduce_the_interpreter[[]pt2-hs_gru_rb_linear[]]",
    "tests/formats/tflite_files/test_tflite_while_hard.py::test_onnx_and_pt2_reproduce_the_interpreter[[]pt2-hs_gru_rb_tanh[]]",
    "tests/formats/tflite_files/test_tflite_while_hard.py::test_onnx_and_pt2_reproduce_the_interpreter[[]pt2-hs_lstm[]]",
    "tests/formats/tflite_files/test_tflite_while_hard.py::test_onnx_and_pt2_reproduce_the_interpreter[[]pt2-hs_lstm_dropout[]]",
    "tests/formats/tflite_files/test_tflite_while_hard.py::test_onnx_and_pt2_reproduce_the_interpreter[[]pt2-k3_hs_gru[]]",
    "tests/formats/tflite_files/test_tflite_while_hard.py::test_onnx_and_pt2_reproduce_the_interpreter[[]pt2-k3_hs_gru_rb_linear[]]",
    "tests/formats/tflite_files/test_tflite_while_hard.py::test_real_wake_word_gru",
    "tests/formats/torch_files/test_field_names.py::test_hdf5_with_own_names",
    "tests/formats/torch_files/test_pt_pickle.py::test_pt_written_with_torch_blocked",
    "tests/formats/torch_files/test_pt_stream.py::test_streamed_pt_runs_like_its_source_in_torch[[]dtype0[]]",
    "tests/performance/test_speed_backend.py::test_plain_and_fast_backends_write_the_same_bytes_with_the_same_verdicts[[]tf1-onnx[]]",
    "tests/security/test_attack_corpus.py::test_bombs_end_with_one_line_within_the_budget[[]*",
    "tests/security/test_attack_corpus.py::test_budget_limits_are_raised_by_their_variable",
    "tests/security/test_attack_corpus.py::test_onnx_identity_chain_is_folded_in_linear_time",
    "tests/security/test_attack_corpus.py::test_only_regular_files_are_read[[]*",
    "tests/security/test_attack_corpus.py::test_markup_and_control_characters_in_names",
    "tests/security/test_attack_corpus.py::test_write_failure_is_one_line_and_leaves_nothing[[]o.npz[]]",
    "tests/security/test_attack_corpus.py::test_write_failure_is_one_line_and_leaves_nothing[[]o.h5[]]",
    "tests/security/test_attack_corpus.py::test_destination_must_be_a_regular_file_or_new",
    "tests/security/test_attack_corpus.py::test_batch_collisions_are_refused_before_converting",
    "tests/security/test_attack_corpus.py::test_verify_reads_dst_as_untrusted",
    "tests/security/test_attack_corpus_outside_data.py::test_inspect_and_verify_refuse_outside_data[[]*",
    "tests/security/test_attack_corpus_outside_data.py::test_hdf5_hard_link_dag_is_walked_once_per_object",
    "tests/security/test_attack_corpus_outside_data.py::test_symlink_loop_source_and_proc_destination",
    "tests/security/test_attack_corpus_outside_data.py::test_batch_output_inside_input_is_not_converted_again",
    "tests/security/test_bad_inputs.py::test_bad_file_is_refused_with_one_line[[]h5_extdataset.h5[]]",
    "tests/security/test_bad_inputs.py::test_bad_file_is_refused_with_one_line[[]h5_extlink.h5[]]",
    "tests/security/test_bad_inputs.py::test_bad_file_is_refused_with_one_line[[]h5_flipped.h5[]]",
    "tests/security/test_bad_inputs.py::test_bad_file_is_refused_with_one_line[[]h5_huge_shape.h5[]]",
    "tests/security/test_bad_inputs.py::test_bad_file_is_refused_with_one_line[[]h5_inf.h5[]]",
    "tests/security/test_bad_inputs.py::test_bad_file_is_refused_with_one_line[[]h5_nan.h5[]]",
    "tests/security/test_bad_inputs.py::test_bad_file_is_refused_with_one_line[[]h5_softlink.h5[]]",
    "tests/security/test_bad_inputs.py::test_bad_file_is_refused_with_one_line[[]h5_truncated.h5[]]",
    "tests/security/test_bad_inputs.py::test_bad_file_is_refused_with_one_line[[]h5_wrong_shape.h5[]]",
    "tests/security/test_keras_config_payload.py::test_payload_as_an_initializer_is_dropped_and_the_conversion_is_clean[[]*",
    "tests/security/test_keras_config_payload.py::test_emitted_module_with_a_module_attribute_name_loads_by_the_documented_steps[[]*",
    "tests/security/test_outputs_attack.py::test_report_never_overwrites_without_force[[]*",
    "tests/security/test_outputs_attack.py::test_emitted_set_whole_after_kills_at_random_moments",
    "tests/security/test_outputs_attack.py::test_folder_output_whole_after_a_kill_at_every_step[[]*",
    "tests/security/test_outputs_attack.py::test_report_takes_mathtext_and_lone_surrogates_as_text",
    "tests/security/test_source_paths.py::test_inspect_and_verify_refuse_an_ir_bin_outside",
    "tests/verify/test_api_report.py::test_convert_report_is_the_cli_report",
    "tests/verify/test_api_report.py::test_verify_and_diagnose_reports",
    "tests/verify/test_cuda_target_cpu.py::test_state_dict_read_back_with_the_source_nonlinearity",
    "tests/verify/test_cuda_target_cpu.py::test_convert_device_cuda_without_a_gpu_is_one_line_and_writes_nothing",
    "tests/verify/test_cuda_target_cpu.py::test_cuda_routes_stream_slab_by_slab",
    "tests/verify/test_diagnose.py::test_fix_is_verified[[]lstm_w_hh_onnx_order[]]",
    "tests/verify/test_diagnose.py::test_fix_is_verified[[]lstm_w_ih_reshaped[]]",
    "tests/verify/test_diagnose.py::test_fix_is_verified[[]lstm_w_hh_blocks_not_transposed[]]",
    "tests/verify/test_diagnose.py::test_fix_is_verified[[]gru_keras_gate_order[]]",
    "tests/verify/test_diagnose.py::test_fix_is_verified[[]gru_biases_summed[]]",
    "tests/verify/test_diagnose.py::test_fix_is_verified[[]pair_gru_keras_order_b_hh_dropped[]]",
    "tests/verify/test_diagnose.py::test_fix_is_verified[[]pair_bidi_exchanged_w_hh_onnx[]]",
    "tests/verify/test_diagnose.py::test_fix_is_verified[[]textgenrnn_layers_exchanged[]]",
    "tests/verify/test_diagnose.py::test_fix_is_verified[[]textgenrnn_cudnn_kernel_transposed[]]",
    "tests/verify/test_diagnose.py::test_cli_ok_and_lines",
    "tests/verify/test_diagnose.py::test_issue43_fix_is_verified_and_matches_the_framework[[]k3_decoder_keras_order[]]",
    "tests/verify/test_diagnose.py::test_issue43_fix_is_verified_and_matches_the_framework[[]k3_decoder_keras_order_renamed[]]",
    "tests/verify/test_diagnose.py::test_issue43_fix_is_verified_and_matches_the_framework[[]textgenrnn_as_2layer_torch_l1_onnx_order[]]",
    "tests/verify/test_diagnose.py::test_real_dinornn_reset_placement_and_keras_order",
    "tests/verify/test_diagnose_pairing.py::test_diagnose_names_the_twelve_slips_grouped",
    "tests/verify/test_diagnose_pairing.py::test_the_suggested_fix_runs_and_keeps_the_users_names",
    "tests/verify/test_diagnose_pairing.py::test_verify_pairs_like_diagnose",
    "tests/verify/test_diagnose_pairing.py::test_a_file_whose_reader_names_layers_otherwise_verifies_by_name_first",
    "tests/verify/test_report.py::test_convert_report",
    "tests/verify/test_report.py::test_report_numbers_are_the_measured_ones",
    "tests/verify/test_report.py::test_report_of_a_failed_verification",
    "tests/verify/test_report.py::test_report_renders_its_plots_in_chromium",
    "tests/verify/test_report_run.py::test_report_states_the_run_and_the_files",
    "tests/verify/test_report_run.py::test_api_report_names_the_python_call",
    "tests/verify/test_report_run.py::test_permuted_gate_blocks_are_named",
    "tests/verify/test_report_run.py::test_tables_follow_the_pairing_when_names_differ",
    "tests/verify/test_report_run.py::test_diagnose_fix_report_holds_the_corrected_files_verification",
    "tests/verify/test_verify_exercised.py::test_units_are_saturated_on_the_default_states",
    "tests/verify/test_verify_exercised.py::test_a_change_twice_the_stated_resolution_fails[[]*",
    "tests/verify/test_verify_exercised.py::test_sequence_far_above_the_measured_float32_spread_is_not_ok",
    "tests/verify/test_verify_loose_fixtures.py::test_reset_before_gru_fixture_is_loose_and_decided_by_its_slips[[]src0-bg2[]]",
    "tests/verify/test_verify_mutations.py::test_correct_textgenrnn_pt_verifies_ok_at_any_length",
    "tests/verify/test_verify_mutations.py::test_issue_14_broken_file_fails_on_the_command_line",
    "tests/verify/test_verify_mutations.py::test_correct_bidi_gru_pt_verifies_ok",
    "tests/verify/test_verify_mutations.py::test_a_failed_step_stays_failed_whatever_else_cannot_decide",
    "tests/verify/test_verify_whole_graph.py::test_correct_graph_is_ok_with_token_inputs",
    "tests/verify/test_verify_whole_graph.py::test_graph_edit_fails[[]*",
    "tests/verify/test_whole_verdict_stable.py::test_whole_verdict_is_the_same_under_other_float32_evaluations[[]whole30_masked_bidir[]]",
    "tests/security/test_attack_corpus_outside_data.py::test_attack_is_one_line_with_its_exit_code[[]*",
    "tests/security/test_keras_config_payload.py::test_payload_in_a_regularizer_or_constraint_is_refused_by_name[[]*",
    "tests/security/test_attack_corpus3_budgets.py::test_budget_attacks_end_with_one_line[[]*",
    "tests/security/test_source_paths.py::test_side_file_is_refused_in_one_line[[]*",
)


#: Modules (or folders) marked slow as a whole, but for the tests :data:`QUICK` names. Measured with
#: ``pytest -m "not slow" --durations=0`` per folder (session 15, the 2-core machine shared by 8 jobs, so
#: seconds of wall time under a load of about 12): the Keras whole-model modules (test_keras_whole.py 925 s for
#: 22 tests, test_emit_module.py 86 s; the others build and run whole models the same way), the Keras streamed
#: reader's grid (193 s, 136 tests), the Keras fixture grid (139 s, 117 tests), test_keras_finite.py (40 s),
#: test_keras_h5_write.py (28 s), test_keras3.py (25 s); tests/engine/test_any_to_any.py (405 s, 139 tests:
#: every reader into every writer; each family's own pair stays in its folder of tests/formats).
SLOW_MODULES = (
    "tests/engine/test_any_to_any.py",
    "tests/formats/whole_models/",
    "tests/formats/keras_files/test_keras_stream.py",
    "tests/formats/keras_files/test_keras_fixtures.py",
    "tests/formats/keras_files/test_keras_finite.py",
    "tests/formats/keras_files/test_keras_h5_write.py",
    "tests/formats/keras_files/test_keras3.py",
    # session 16: each over 30 s of CPU (the slip corpus verifies 133 edited files; the real Silero VAD writes a
    # Keras .h5; the OpenVINO wiring edits compile IRs)
    "tests/verify/test_slip_corpus.py",
    "tests/verify/test_verdict_stability.py",
    "tests/formats/onnx_files/test_silero_vad.py",
    "tests/formats/openvino_files/test_openvino_wiring.py",
    # session 17: a crafted .pt2 per attack through the CLI; the wiring check's memory bound runs verifications
    "tests/security/test_pt2_payload.py",
    "tests/verify/test_onnx_wiring_bounded.py",
    # session 18: rule A against the measured tolerance on the loose Keras fixture; the fused wiring run converts
    # four stacked torch layers
    "tests/verify/test_rule_a_applied.py",
    "tests/verify/test_onnx_wired_fused.py",
)

#: Tests kept in the quick tier although :data:`SLOW` or :data:`SLOW_MODULES` names them: one read + write +
#: verify per family against the family's own framework (Keras H5 read and write, Keras 3, whole models)
QUICK = (
    "tests/formats/keras_files/test_keras_fixtures.py::test_convert_to_torch_or_refuse[[]cudnn_lstm.h5[]]",
    "tests/formats/keras_files/test_keras_fixtures.py::test_framework_forward_matches_tf_keras[[]cudnn_lstm.h5[]]",
    "tests/formats/keras_files/test_keras_h5_write.py::test_torch_to_keras2_h5[[]GRU-2-keras[]]",
    "tests/formats/keras_files/test_keras3.py::test_textgenrnn_via_pt_to_keras3",
    "tests/formats/whole_models/test_whole_conv.py::test_onnx_graph_matches_tf_keras[[]conv_crnn[]]",
    "tests/formats/whole_models/test_whole_graph.py::test_onnx_graph_matches_tf_keras[[]whole30_embed_conv_lstm[]]",
    # session 16: one case of each contract the CPU rule above moved: TensorFlow reads what the pure bundle reader
    # reads, a bomb and a damaged HDF5 end in one line, one file of each security corpus, a whole-model graph
    # verified ok and a broken one failed, a per-layer verification ok, the HTML report
    "tests/formats/tf_files/test_tf_bundle.py::test_both_readers_give_the_same_checkpoint[[]lstm_cell[]]",
    "tests/security/test_attack_corpus.py::test_bombs_end_with_one_line_within_the_budget[[]keras3_gzip_bomb.weights.h5[]]",
    "tests/security/test_bad_inputs.py::test_bad_file_is_refused_with_one_line[[]h5_truncated.h5[]]",
    "tests/security/test_attack_corpus_outside_data.py::test_attack_is_one_line_with_its_exit_code[[]overlap.safetensors[]]",
    "tests/security/test_keras_config_payload.py::test_payload_in_a_regularizer_or_constraint_is_refused_by_name[[]lstm_kernel_regularizer-keras[]]",
    "tests/security/test_attack_corpus3_budgets.py::test_budget_attacks_end_with_one_line[[]dag_key.pdparams[]]",
    "tests/security/test_source_paths.py::test_side_file_is_refused_in_one_line[[]ir_utf8_dtd[]]",
    "tests/verify/test_verify_whole_graph.py::test_correct_graph_is_ok_with_token_inputs",
    "tests/verify/test_verify_whole_graph.py::test_graph_edit_fails[[]Y[[]-1[]] for Y_h[]]",
    "tests/verify/test_verify_mutations.py::test_correct_bidi_gru_pt_verifies_ok",
    "tests/verify/test_report.py::test_convert_report",
    "tests/formats/tflite_files/test_tflite_while_hard.py::test_onnx_and_pt2_reproduce_the_interpreter[[]pt2-k3_hs_gru[]]",
)


def pytest_collection_modifyitems(config, items):
    from fnmatch import fnmatchcase

    for item in items:
        slow = (any(fnmatchcase(item.nodeid, pat) for pat in SLOW)
                or any(item.nodeid.startswith(m) for m in SLOW_MODULES))
        if slow and not any(fnmatchcase(item.nodeid, pat) for pat in QUICK):
            item.add_marker(pytest.mark.slow)


class FnSlabs:
    """A test :class:`rnnconvert.core.model.SlabSource` reading slab ``(i, k)`` through ``fn(i, k)``; holds
    nothing, so ``release``/``release_array`` do nothing."""

    def __init__(self, fn) -> None:
        self.fn = fn

    def read(self, i: int, k: int):
        return self.fn(i, k)

    def release(self, i: int, k: int) -> None:
        pass

    def release_array(self, a) -> None:
        pass


def cuda_mark():
    """The skip mark of the tests that run cuDNN (marked ``cuda`` as well), with the reason they skip."""
    from rnnconvert.verify.cudnn_layout import cuda_available

    why = ("needs torch.cuda.is_available() with cuDNN" + ("" if CUDA_TESTS else
           "; the suite hides GPUs unless RNNCONVERT_CUDA_TESTS=1 (docs/gpu-validation.md)"))
    return pytest.mark.skipif(not (CUDA_TESTS and cuda_available()), reason=why)


def cudnn_gate_distinct(rng, shape, gates_, axis=0):
    """Gate block k uniform in [0.1k-0.05, 0.1k+0.05] plus a small signed noise."""
    import numpy as np

    n = shape[axis] // gates_
    blocks = []
    for k in range(gates_):
        s = list(shape)
        s[axis] = n
        blocks.append(rng.uniform(0.1 * k - 0.05, 0.1 * k + 0.05, s) * rng.choice([-1, 1], s))
    return np.concatenate(blocks, axis=axis).astype(np.float32)


def random_layer(spec, seed=0, dtype=None):
    """A canonical layer of the cuDNN ``spec`` with gate-distinct weights (:func:`cudnn_gate_distinct`)."""
    import numpy as np

    from rnnconvert.core.model import Cell, DirectionParams, RNNLayer, Semantics

    dtype = np.float32 if dtype is None else dtype
    rng = np.random.default_rng(seed)
    G, H, P = spec.cell.gates, spec.hidden_size, spec.proj_size
    params = []
    for k in range(spec.num_layers):
        params.append([DirectionParams(
            w_ih=cudnn_gate_distinct(rng, (G * H, spec.layer_input_size(k)), G).astype(dtype),
            w_hh=cudnn_gate_distinct(rng, (G * H, P or H), G).astype(dtype),
            b_ih=cudnn_gate_distinct(rng, (G * H,), G).astype(dtype),
            b_hh=cudnn_gate_distinct(rng, (G * H,), G).astype(dtype),
            w_hr=rng.uniform(-0.5, 0.5, (P, H)).astype(dtype) if P else None) for _ in range(spec.dirs)])
    sem = Semantics(activation="relu" if spec.cell is Cell.RNN_RELU else "tanh")
    return RNNLayer("l", spec.cell, spec.input_size, H, spec.num_layers, spec.bidirectional, P,
                    semantics=sem, params=params)


def fixture_script(name: str):
    """A generator script of fixtures/ (``gen_slips`` ...) imported from its file, without putting fixtures/ on
    ``sys.path`` (its folders ``jax/``, ``paddle/``... would shadow those packages as namespace packages)."""
    import importlib.util
    import sys

    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, FIXTURES / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod



# ---- whole-model tests (tests/formats/whole_models): one loader for the Keras whole-model fixtures ----------------

#: the whole-model checks' tolerance, relative to ``max(1, max|ref|)`` (issues #17/#30, as the ``.pt2`` and
#: ONNX checks)
WHOLE_TOL = 2e-5


def whole_model(path, source=None):
    """``(ckpt, full)`` of a whole Keras model file: ``rnnconvert.load(path)`` and its whole model, read by
    ``source(ckpt)`` (default :func:`rnnconvert.formats.keras.keras_whole.read_full_model`; Keras 3 files:
    ``whole_source.whole_source``)."""
    import rnnconvert

    if source is None:
        from rnnconvert.formats.keras import keras_whole

        source = keras_whole.read_full_model
    ckpt = rnnconvert.load(path)
    return ckpt, source(ckpt)


def whole_graph(path, edit=None, source=None):
    """The whole model of ``path`` (:func:`whole_model`) as a ``keras_graph`` graph; ``edit(config)`` first
    changes a deep copy of its config where given."""
    import copy

    from rnnconvert.whole.conventions import keras_graph

    ckpt, full = whole_model(path, source)
    config = full.config
    if edit:
        config = copy.deepcopy(config)
        edit(config)
    return keras_graph.build(config, full.weights, ckpt)


def whole_feeds(g, z, first_if_unnamed: bool = False) -> dict:
    """The oracle's inputs ``in__<name>`` of ``z`` (an ``.npz``) for each input of graph ``g``, by name; with
    ``first_if_unnamed``, the oracle's first input where ``z`` has none of that name."""
    if first_if_unnamed:
        ins = [k for k in z.files if k.startswith("in__")]
        return {n: (z[f"in__{n}"] if f"in__{n}" in z.files else z[ins[0]]) for n, *_ in g.inputs}
    return {n: z[f"in__{n}"] for n, *_ in g.inputs}


def whole_close(got, ref, tol: float = WHOLE_TOL) -> bool:
    """``max|got - ref| <= tol * max(1, max|ref|)`` in float64."""
    import numpy as np

    ref = np.asarray(ref, np.float64)
    return float(np.max(np.abs(np.asarray(got, np.float64) - ref))) <= tol * max(1.0, float(np.max(np.abs(ref))))


def ort_run(model, feeds: dict, names: list[str]) -> list:
    """``names`` run by onnxruntime (CPU) on ``model`` (an ``onnx.ModelProto``, its bytes or a file), each feed cast to
    the dtype the session declares for it (int32 or float32)."""
    import numpy as np
    import onnxruntime as ort

    import os

    if isinstance(model, (str, os.PathLike)):  # a written file
        with open(model, "rb") as fh:
            model = fh.read()
    blob = model if isinstance(model, bytes) else model.SerializeToString()
    s = ort.InferenceSession(blob, providers=["CPUExecutionProvider"])
    kinds = {i.name: (np.int32 if i.type == "tensor(int32)" else np.float32) for i in s.get_inputs()}
    return s.run(names, {k: np.asarray(v).astype(kinds[k]) for k, v in feeds.items()})


def whole_err(got, ref) -> float:
    """``max|got - ref| / max(1, max|ref|)`` in float64: the relative error :func:`whole_close` bounds."""
    import numpy as np

    ref = np.asarray(ref, np.float64)
    return float(np.max(np.abs(np.asarray(got, np.float64) - ref))) / max(1.0, float(np.max(np.abs(ref))))


def whole_fixture_graph(folder, name: str, edit=None):
    """:func:`whole_graph` of ``folder / name``: a ``.keras`` file read by
    :func:`rnnconvert.formats.keras.keras3.read_full_model`, others by the tf_keras reader."""
    if name.endswith(".keras"):
        from rnnconvert.formats.keras import keras3

        return whole_graph(folder / name, edit, source=keras3.read_full_model)
    return whole_graph(folder / name, edit)


def whole_length_cases(folder, name: str):
    """``(n, feeds, outs)`` for each length ``n`` of the oracle ``<stem>.npz`` beside ``folder / name``: its
    ``in__<input>__<n>`` by input name and its ``out__<i>__<n>`` in output order."""
    import numpy as np

    z = np.load(folder / (name.rsplit(".", 1)[0] + ".npz"))
    for n in z["lengths"]:
        feeds = {k[4:].rsplit("__", 1)[0]: z[k] for k in z.files if k.startswith("in__") and k.endswith(f"__{n}")}
        outs = [z[f"out__{i}__{n}"] for i in range(sum(1 for k in z.files if k.startswith("out__")
                                                        and k.endswith(f"__{n}")))]
        yield int(n), feeds, outs


def whole_torch_args(g, feeds: dict, int_dtype) -> list:
    """The torch tensors of ``feeds`` in the order of ``g.inputs``: token inputs as ``int_dtype``, others float32."""
    import numpy as np
    import torch

    return [torch.from_numpy(np.asarray(feeds[i[0]]).astype(int_dtype if i[3] is not None else np.float32))
            for i in g.inputs]


def assert_whole_onnx_lengths(model, folder, name: str) -> None:
    """onnxruntime on ``model`` at each stored length of :func:`whole_length_cases` ``(folder, name)``: every output
    of the oracle's shape and :func:`whole_close` to it."""
    import numpy as np

    for n, feeds, outs in whole_length_cases(folder, name):
        got = ort_run(model, feeds, [f"output_{i}" for i in range(len(outs))])
        for i, (y, ref) in enumerate(zip(got, outs)):
            assert y.shape == ref.shape and whole_close(y, ref), (name, n, i, float(np.abs(y - ref).max()))


def assert_whole_torch_lengths(module, g, folder, name: str, int_dtype, shape: bool = False) -> None:
    """The torch ``module`` (a ``.pt2`` program or an emitted ``nn.Module``) under ``torch.no_grad`` on
    :func:`whole_torch_args` at each stored length of :func:`whole_length_cases` ``(folder, name)``: every output
    :func:`whole_close` to the oracle's (``shape``: and of its shape)."""
    import numpy as np
    import torch

    for n, feeds, outs in whole_length_cases(folder, name):
        with torch.no_grad():
            got = module(*whole_torch_args(g, feeds, int_dtype))
        got = got if isinstance(got, (tuple, list)) else (got,)
        for i, (y, ref) in enumerate(zip(got, outs)):
            y = y.numpy()
            assert (not shape or y.shape == ref.shape) and whole_close(y, ref), (name, n, i,
                                                                                 float(np.abs(y - ref).max()))


def whole_emitted_module(g, tmp_path, stem: str):
    """The ``nn.Module`` that ``module_write.emit(g)`` writes, imported from its file ``tmp_path/<stem>.py`` with its
    state loaded from ``tmp_path/state.pt`` (``weights_only=True``), in eval mode."""
    import importlib.util

    import torch

    from rnnconvert.whole.formats.torch import module_write

    em = module_write.emit(g)
    src = tmp_path / f"{stem}.py"
    src.write_text(em.source)
    (tmp_path / "state.pt").write_bytes(module_write.state_bytes(em.state))
    spec = importlib.util.spec_from_file_location(stem, src)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    m = mod.Model()
    m.load_state_dict(torch.load(tmp_path / "state.pt", weights_only=True))
    m.eval()
    return m


def whole_pt2_program(g, tmp_path):
    """The ``.pt2`` program of ``g`` (``pt2_write.export``) saved as ``tmp_path/p.pt2`` and loaded back by
    ``torch.export.load``: its module."""
    import torch

    from rnnconvert.whole.formats.torch import pt2_write

    torch.export.save(pt2_write.export(g), str(tmp_path / "p.pt2"))
    return torch.export.load(str(tmp_path / "p.pt2")).module()


def whole_onnx_model(g, **kw):
    """The ONNX graph (``onnx.ModelProto``) that ``model_write.build(g, **kw)`` writes for the graph ``g``."""
    from rnnconvert.whole.formats.onnx import model_write

    return model_write.build(g, **kw)


def whole_onnx_outputs(g, feeds: dict) -> list:
    """onnxruntime's ``output_<i>`` for every output of ``g`` on the ONNX graph :func:`whole_onnx_model` writes."""
    return ort_run(whole_onnx_model(g), feeds, [f"output_{i}" for i in range(len(g.outputs))])


def assert_whole_outputs(outs, z, what) -> None:
    """Each of ``outs`` (numpy arrays or torch tensors) :func:`whole_close` to the oracle's ``out__<i>`` of ``z``;
    the message names ``(what, i)``."""
    for i, y in enumerate(outs):
        y = y.detach().numpy() if hasattr(y, "detach") else y
        assert whole_close(y, z[f"out__{i}"]), (what, i)


def whole_mutated_check(path, mutate, source=None, cast: bool = False):
    """``keras_whole_check.compare_whole`` (the source framework against onnxruntime) on the graph written from
    :func:`whole_model` ``(path, source)`` after ``mutate(model)``; ``cast``: each feed cast to the dtype the
    session declares (int32 or float32)."""
    import numpy as np
    import onnxruntime as ort

    from rnnconvert.whole.conventions import keras_graph
    from rnnconvert.whole.formats.onnx import model_write
    from rnnconvert.whole.verify import keras_whole_check

    ckpt, full = whole_model(path, source)
    model = model_write.build(keras_graph.build(full.config, full.weights, ckpt))
    mutate(model)
    s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    kinds = {i.name: (np.int32 if i.type == "tensor(int32)" else np.float32) for i in s.get_inputs()}
    outs = [o.name for o in s.get_outputs() if o.name.startswith("output_")]

    def target(xs):
        return s.run(outs, {k: np.asarray(v).astype(kinds[k]) for k, v in xs.items()} if cast else xs), {}

    return keras_whole_check.compare_whole(str(path), full, target, "onnxruntime (mutated)")


# ---- torch modules shared by tests/formats/onnx_files and torch_files ----------------------------------------

#: the torch RNN modules of the ONNX and PyTorch-file round trips: ``(class, keyword arguments)``
TORCH_SPECS = [
    ("LSTM", dict(num_layers=1)),
    ("LSTM", dict(num_layers=2, bidirectional=True)),
    ("LSTM", dict(num_layers=3, bias=False)),
    ("GRU", dict(num_layers=1)),
    ("GRU", dict(num_layers=2, bidirectional=True, bias=False)),
    ("RNN", dict(num_layers=1)),
    ("RNN", dict(num_layers=2, bidirectional=True, nonlinearity="relu")),
]
TORCH_IDS = [f"{c}-" + "-".join(f"{k}={v}" for k, v in kw.items()) for c, kw in TORCH_SPECS]


def torch_gate_distinct(shape, gates, rng, scale=0.5):
    """Gate block k uniform around 0.1*k (+ noise): a permutation slip changes the numbers visibly."""
    import numpy as np

    rows = shape[0] // gates
    blocks = [0.1 * (k + 1) + rng.uniform(-0.05, 0.05, (rows,) + tuple(shape[1:])) for k in range(gates)]
    return (np.concatenate(blocks) * scale * rng.choice([-1, 1], shape)).astype(np.float32)


def torch_module(cls, kw, seed=0, I=5, H=4):
    """A batch-first ``torch.nn.<cls>(I, H, **kw)`` in eval mode, every parameter :func:`torch_gate_distinct`."""
    import numpy as np
    import torch

    rng = np.random.default_rng(seed)
    mod = getattr(torch.nn, cls)(input_size=I, hidden_size=H, batch_first=True, **kw).eval()
    G = {"LSTM": 4, "GRU": 3, "RNN": 1}[cls]
    sd = {k: torch.from_numpy(torch_gate_distinct(tuple(v.shape), G, rng)) for k, v in mod.state_dict().items()}
    mod.load_state_dict(sd)
    return mod


def torch_x(I=5, seed=1):
    """A ``(2, 6, I)`` float32 standard normal input."""
    import numpy as np

    return np.random.default_rng(seed).standard_normal((2, 6, I)).astype(np.float32)
