"""The doctor on real error texts from Transformer Engine's issue tracker (and the few build errors it
links to), the fix commands it fills in from the probe, installed-state checks, and unknown errors."""
from __future__ import annotations

import contextlib
import re
import signal
import unicodedata

try:  # the parser behind `re`: its parse tree shows every repeat's bounds
    from re import _constants as sre
    from re import _parser as sre_parser
except ImportError:  # Python 3.10
    import sre_constants as sre
    import sre_parse as sre_parser

import pytest
from te_fixtures import machine

from workbench import cli
from workbench.env import doctor

# (source, error text as reported there, the diagnosis that must come first)
REAL_ERRORS = [
    ("NVIDIA/TransformerEngine#1192",
     "ImportError: /usr/local/lib/python3.10/dist-packages/transformer_engine/transformer_engine_torch.cpython-310-"
     "x86_64-linux-gnu.so: undefined symbol: _ZN3c105ErrorC2ENS_14SourceLocationENSt7__cxx1112basic_stringIcSt11char_"
     "traitsIcESaIcEEE", "extension_abi_mismatch"),
    ("NVIDIA/TransformerEngine#1309",
     "/envs/megatron/lib/python3.9/site-packages/torch/include/ATen/cudnn/cudnn-wrapper.h:3:10: fatal error: cudnn.h: "
     "No such file or directory\n    3 | #include <cudnn.h>\n      |          ^~~~~~~~~\ncompilation terminated.\n"
     "ninja: build stopped: subcommand failed.", "cudnn_headers_missing"),
    ("NVIDIA/TransformerEngine#954",
     "CMake Error at cmake/FindCUDNN.cmake:19 (find_library):\n  Could not find cudnn_LIBRARY using the following "
     "names: cudnn, libcudnn.so.", "cudnn_headers_missing"),
    ("NVIDIA/TransformerEngine#2040",
     "OSError: libcublas.so.13: cannot open shared object file: No such file or directory", "core_cuda_major_mismatch"),
    ("NVIDIA/Megatron-LM#1882 (TE fused attention)",
     "fused_attn_f16_arbitrary_seqlen.cu:373 in function operator(): cuDNN Error: CUDNN_BACKEND_TENSOR_DESCRIPTOR "
     "cudnnFinalize failedptrDesc->finalize() cudnn_status: CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED.",
     "cudnn_sublibrary_loading"),
    ("NVIDIA/TransformerEngine#1853",
     "transformer_engine failed to import with exception libcudnn_adv.so.9: cannot open shared object file: No such "
     "file or directory", "cudnn_sublibrary_loading"),
    ("NVIDIA/TransformerEngine#2505",
     "FileNotFoundError: Could not find shared object file for Transformer Engine torch lib.",
     "torch_extension_missing"),
    ("NVIDIA/TransformerEngine#1981",
     "INFO transformer_engine.common - INFO - Could not find package transformer_engine_torch. Install "
     "transformer-engine using 'pip3 install transformer-engine[pytorch]==VERSION'", "torch_extension_missing"),
    ("NVIDIA/TransformerEngine#2410",
     "AssertionError: Could not find `transformer-engine` PyPI package.", "mixed_te_packages"),
    ("transformer_engine/common/__init__.py (TE 2.20.2)",
     "AssertionError: Transformer Engine package version mismatch. Found transformer_engine_torch v2.9.0, "
     "transformer-engine v2.8.0, and transformer-engine-cu12 v2.8.0.", "mixed_te_packages"),
    ("NVIDIA/TransformerEngine#553",
     "RuntimeError:\n      The detected CUDA version (12.2) mismatches the version that was used to compile\n"
     "      PyTorch (11.7). Please make sure to use the same CUDA versions.", "cuda_toolkit_mismatch"),
    ("NVIDIA/TransformerEngine#1249 (advice: MAX_JOBS=1); text as in PennyLaneAI/catalyst#1000",
     "FAILED: build/temp.linux-x86_64-cpython-311/csrc/extensions/attention.o\n"
     "c++: fatal error: Killed signal terminated program cc1plus\ncompilation terminated.\n"
     "ninja: build stopped: subcommand failed.", "build_out_of_memory"),
    ("NVIDIA/TransformerEngine#2383",
     "RuntimeError: Error compiling objects for extension\n      [end of output]\n  ERROR: Failed building wheel for "
     "transformer_engine_torch\nFailed to build transformer_engine_torch", "extension_build_failed"),
    ("transformer_engine_torch 2.20.2 sdist, build_tools/utils.py",
     "RuntimeError: nvidia-cudnn-frontend is required to build Transformer Engine. Install it with `pip install "
     "nvidia-cudnn-frontend`.", "cudnn_frontend_missing"),
    ("our H200 logs (results/reference/h200/roofline/levers/), TE 2.20.2 with jax and no JAX extension",
     "transformer_engine/__init__.py:130: RuntimeWarning: Detected a Jax installation but could not find the shared "
     "object file for the Transformer Engine Jax extension library. If this is not intentional, please reinstall "
     "Transformer Engine with `pip install transformer_engine[jax]` or build from source with `NVTE_FRAMEWORK=jax`.",
     "jax_extension_missing"),
    ("transformer_engine_jax 2.20.2 sdist, pip without jax",
     "      ModuleNotFoundError: No module named 'jax'\n      RuntimeError: This package needs Jax to build.",
     "jax_missing_at_build"),
    ("NVIDIA/TransformerEngine#3382",
     "jax.errors.JaxRuntimeError: FAILED_PRECONDITION: Types used by FFI handlers must be registered before the "
     "handler registration", "jax_ffi_registration_order"),
    ("pip, offline wheelhouse without the extension",
     "ERROR: Could not find a version that satisfies the requirement transformer_engine_torch==2.20.2 (from versions: "
     "none)\nERROR: No matching distribution found for transformer_engine_torch==2.20.2", "package_not_in_index"),
]


@pytest.mark.parametrize("source,text,expected", REAL_ERRORS, ids=[e[2] + ":" + e[0].split()[0] for e in REAL_ERRORS])
def test_real_error_text_gets_the_right_diagnosis_first(source, text, expected):
    found = doctor.diagnose(text, machine())
    assert found, f"nothing matched the text from {source}"
    assert found[0].id == expected, [d.id for d in found]
    # the evidence is the line the failure's own pattern matched, not any text
    failure = next(f for f in doctor.KNOWN_FAILURES if f.id == expected)
    assert found[0].fix and any(re.search(p, found[0].evidence, re.IGNORECASE) for p in failure.patterns)


def test_fix_commands_are_filled_from_the_probe():
    env = machine(torch_cuda="13.0", torch_cuda_major=13, te_version="2.20.2", compute_capability="9.0")
    abi = doctor.diagnose("undefined symbol: _ZN3c104cuda9SetDeviceEi", env)[0]
    assert any("NVTE_CUDA_ARCHS=90" in c and "transformer_engine_torch==2.20.2" in c for c in abi.fix)
    cublas = doctor.diagnose("OSError: libcublas.so.12: cannot open shared object file", env)[0]
    assert "CUDA 12" in cublas.cause and any("transformer_engine[pytorch,core_cu13]==2.20.2" in c for c in cublas.fix)
    cudnn = doctor.diagnose("fatal error: cudnn.h: No such file or directory", env)[0]
    assert any(c == f"export CUDNN_PATH={env['cudnn_pip_root']} CUDNN_HOME={env['cudnn_pip_root']}" for c in cudnn.fix)


def test_unknown_values_stay_visible_placeholders():
    fix = doctor.diagnose("undefined symbol: _ZN3c10", {})[0].fix
    assert any("NVTE_CUDA_ARCHS=<ARCHS>" in c and "==<TE_VERSION>" in c for c in fix)


def test_oom_is_preferred_over_the_generic_ninja_failure():
    ids = [d.id for d in doctor.diagnose("Killed\nninja: build stopped: subcommand failed.")]
    assert ids == ["build_out_of_memory", "extension_build_failed"]


def test_unrelated_text_matches_nothing():
    assert doctor.diagnose("Successfully installed transformer_engine-2.20.2\n") == []


def test_installed_state_with_mixed_versions_and_wrong_core(tmp_path):
    env = machine(torch_cuda="13.0", torch_cuda_major=13, te_packages={
        "transformer-engine": "2.8.0", "transformer-engine-cu12": "2.8.0", "transformer-engine-torch": "2.9.0"})
    from workbench.env import probe

    env["te_consistency"] = probe.consistency(env)
    ids = [d.id for d in doctor.check_installed(env)]
    assert ids[:2] == ["mixed_te_packages", "core_cuda_major_mismatch"]


def test_installed_state_healthy_has_no_findings():
    env = machine(te_available=True, te_import_error=None, te_version="2.20.2",
                  te_packages={"transformer-engine": "2.20.2", "transformer-engine-cu12": "2.20.2",
                               "transformer-engine-torch": "2.20.2"})
    from workbench.env import probe

    env["te_consistency"] = probe.consistency(env)
    assert doctor.check_installed(env) == []


def test_no_te_installed_says_how_to_install():
    assert [d.id for d in doctor.check_installed(machine())] == ["te_not_installed"]


def test_cli_doctor_on_a_log_prints_cause_and_fix(tmp_path, capsys):
    log = tmp_path / "install.log"
    log.write_text(REAL_ERRORS[3][1])
    assert cli.main(["doctor", "--log", str(log)]) == 1
    out = capsys.readouterr().out
    assert "[core_cuda_major_mismatch]" in out and "fix:" in out


def test_cli_doctor_on_an_unknown_error_says_so_and_points_to_the_log(tmp_path, capsys):
    log = tmp_path / "install.log"
    log.write_text("something nobody has seen before\n")
    assert cli.main(["doctor", "--log", str(log), "--json"]) == 1
    out = capsys.readouterr().out
    assert '"id": "unknown"' in out and str(log) in out


def test_cudnn_undefined_symbol_is_a_cudnn_mix_not_a_torch_abi_mismatch():
    # the form seen on the H200 when TE dlopened the system cuDNN next to torch's (commit cfd337e)
    text = ("OSError: /usr/lib/x86_64-linux-gnu/libcudnn_graph.so.9: undefined symbol: cudnnGetLastErrorString, "
            "version libcudnn.so.9")
    assert [d.id for d in doctor.diagnose(text)] == ["cudnn_sublibrary_loading"]


def test_torch_finding_the_other_cudnn_is_the_same_mix():
    """Seen on the H200 when TE had loaded the system cuDNN 9.14 before torch initialised its own 9.19."""
    text = ("RuntimeError: cuDNN version incompatibility: PyTorch was compiled  against (9, 19, 0) but found "
            "runtime version (9, 14, 0). PyTorch already comes bundled with cuDNN.")
    assert doctor.diagnose(text)[0].id == "cudnn_sublibrary_loading"


def test_an_unmatched_import_error_points_to_the_install_log():
    env = machine(te_import_error="ImportError: something nobody has seen before")
    (d,) = doctor.check_installed(env, "results/install/20261129-1/install.log")
    assert not d.known and d.fix == ["read the full log: results/install/20261129-1/install.log"]


# --------------------------------------------------------------- hostile logs: huge lines, binary junk
def _repeats(parsed) -> list[tuple[int, int]]:
    """(min, max) of every repeat in a parsed pattern, nested ones included."""
    out = []
    for op, arg in parsed:
        if op in (sre.MAX_REPEAT, sre.MIN_REPEAT):
            out.append(arg[:2])
            out += _repeats(arg[2])
        elif op == sre.SUBPATTERN:
            out += _repeats(arg[-1])
        elif op == sre.BRANCH:
            for branch in arg[1]:
                out += _repeats(branch)
        elif op in (sre.ASSERT, sre.ASSERT_NOT):
            out += _repeats(arg[1])
    return out


@pytest.mark.parametrize("failure", doctor.KNOWN_FAILURES, ids=[f.id for f in doctor.KNOWN_FAILURES])
def test_every_pattern_repeats_a_bounded_number_of_times(failure):
    """`\\S*` or `\\w+` before a literal backtracks quadratically on a long token (9.5 s on 100 KB before)."""
    for pattern in failure.patterns:
        unbounded = [r for r in _repeats(sre_parser.parse(pattern)) if r[1] == sre.MAXREPEAT]
        assert not unbounded, f"{pattern!r} has an unbounded repeat"


@contextlib.contextmanager
def watchdog(seconds: int):
    """Turn a hang into a failure (generous: it catches runaway backtracking, it does not time anything)."""
    def hang(signum, frame):
        raise AssertionError(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, hang)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _prefix(pattern: str) -> str:
    """A pattern's leading literal text ('' if it starts with a class): repeated, it is the worst input."""
    return re.match(r"[\w ':!.-]*", pattern.lstrip("^(").replace("\\", "")).group(0)


HOSTILE = [  # each 100-200 KB on one line: a token, a line of words, and every pattern's prefix over and over
    "undefined symbol: _ZN" + "a" * 100_000,
    "a" * 100_000 + ".wh",
    "x " * 100_000,
    *((_prefix(p) or "x") * (100_000 // max(1, len(_prefix(p)))) for f in doctor.KNOWN_FAILURES for p in f.patterns),
]


def test_hostile_logs_are_diagnosed_without_hanging():
    with watchdog(20):
        for text in HOSTILE:
            doctor.diagnose(text)
        # a real error on a 200 KB line is still found, and a 100 KB token does not hide the next line
        long_line = "OSError: libcublas.so.13: cannot open shared object file: No such file " + "x " * 100_000
        assert doctor.diagnose(long_line)[0].id == "core_cuda_major_mismatch"
        token_then_error = "a" * 100_000 + "\nfatal error: cudnn.h: No such file or directory"
        found = doctor.diagnose(token_then_error)
    assert [d.id for d in found] == ["cudnn_headers_missing"] and found[0].evidence.startswith("fatal error: cudnn.h")


BINARY_LOG = (b"\x1b[31mERROR\x1b[0m: \x00\xff\xfe OSError: libcublas.so.13: cannot open shared object file"
              b"\x1b]0;pwned\x07\r\n"
              b"\x1b[2J\x1b[H\x08\x08garbage \xc3\x28 \x9b31m more\n")


def _control_chars(text: str) -> list[str]:
    return [hex(ord(c)) for c in text if c != "\n" and unicodedata.category(c) in ("Cc", "Cf")]


def test_a_binary_log_is_diagnosed_and_printed_without_control_characters(tmp_path, capsys):
    log = tmp_path / "install.log"
    log.write_bytes(BINARY_LOG)
    assert cli.main(["doctor", "--log", str(log)]) == 1
    out = capsys.readouterr().out
    assert "[core_cuda_major_mismatch]" in out and "seen: ERROR: " in out
    assert _control_chars(out) == []


def test_an_unknown_binary_log_is_quoted_without_control_characters(tmp_path, capsys):
    log = tmp_path / "junk.log"
    log.write_bytes(BINARY_LOG.replace(b"libcublas", b"libfoo"))
    assert cli.main(["doctor", "--log", str(log)]) == 1
    out = capsys.readouterr().out
    assert "[unknown]" in out and "garbage" in out and _control_chars(out) == []


def test_printable_keeps_the_text_and_drops_escapes():
    assert doctor.printable("\x1b[1;31mred\x1b[0m\ttab\nline\x1b]0;title\x07 end\r\x00\u202e") == "red\ttab\nline end"


@pytest.mark.parametrize("target", ["missing.log", "."], ids=["missing", "a-folder"])
def test_cli_doctor_on_a_log_it_cannot_read_is_one_line_and_exit_2(tmp_path, capsys, target):
    assert cli.main(["doctor", "--log", str(tmp_path / target)]) == 2
    captured = capsys.readouterr()
    assert "Traceback" not in captured.out + captured.err
    assert captured.err.count("\n") == 1 and f"--log {tmp_path / target}" in captured.err
