"""The `kiln` command (kiln/cli): each subcommand run as `python -m kiln ...` in a subprocess,
with its own KILN_CACHE_DIR."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def kiln_command(*args, cache_dir, cwd=REPO_ROOT, extra_env=None, timeout=600):
    env = {key: value for key, value in os.environ.items() if not key.startswith("KILN_")}
    env.pop("TRITON_INTERPRET", None)
    env.update({"KILN_CACHE_DIR": str(cache_dir), "PYTHONPATH": REPO_ROOT, **(extra_env or {})})
    return subprocess.run([sys.executable, "-m", "kiln", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_help_lists_every_command(tmp_path):
    result = kiln_command("--help", cache_dir=tmp_path)
    assert result.returncode == 0, result.stderr
    for command in ("verify", "bench", "cache", "report"):
        assert command in result.stdout
    for command in ("verify", "bench", "cache"):
        sub = kiln_command(command, "--help", cache_dir=tmp_path)
        assert sub.returncode == 0 and "usage: kiln " + command in sub.stdout, sub.stderr


def test_verify_compiles_and_checks_the_programs_on_the_cpu(tmp_path):
    result = kiln_command("verify", cache_dir=tmp_path)
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    for name in ("python", "torch", "triton", "transformers", "kiln", "C++ compiler", "OpenMP", "CUDA"):
        assert name in out
    for program in ("pointwise chain", "reduction", "softmax", "small MLP"):
        assert f"ok    cpu, C++                 {program}" in out
    assert "FAIL" not in out and "OK: 4 checks passed" in out
    assert "--triton-interpreter" in out  # says how to check the Triton kernels too
    assert os.listdir(tmp_path / "cpp")  # it compiled, into the cache it was given


def test_verify_fails_and_says_what_to_install_without_a_compiler(tmp_path):
    result = kiln_command("verify", cache_dir=tmp_path, extra_env={"KILN_CPP_COMPILER": str(tmp_path / "no-g++")})
    assert result.returncode == 1
    assert "C++ compiler  none" in result.stdout and "apt install g++" in result.stdout
    assert "FAILED: kiln can compile for no device here" in result.stdout


def test_cache_info_and_clear(tmp_path):
    cache = tmp_path / "cache"
    empty = kiln_command("cache", "info", cache_dir=cache)
    assert empty.returncode == 0 and str(cache) in empty.stdout and "empty" in empty.stdout
    (cache / "triton" / "ab").mkdir(parents=True)
    (cache / "triton" / "ab" / "kab.py").write_text("x" * 100)
    (cache / "triton" / "ab" / "kac.py").write_text("y" * 50)
    (cache / "cpp" / "cd").mkdir(parents=True)
    (cache / "cpp" / "cd" / "kcd.so").write_bytes(b"\0" * 2048)
    info = kiln_command("cache", "info", cache_dir=cache)
    assert info.returncode == 0
    lines = {line.split()[0]: line.split()[1:] for line in info.stdout.splitlines()[1:] if line.startswith("  ")}
    assert lines["triton"][:4] == ["2", "entries", "150", "B"]
    assert lines["cpp"][:4] == ["1", "entries", "2.0", "KiB"]
    assert lines["total"][:2] == ["3", "entries"]
    cleared = kiln_command("cache", "clear", cache_dir=cache)
    assert cleared.returncode == 0
    assert "removed triton: 2 entries, 150 B" in cleared.stdout and "removed cpp: 1 entries" in cleared.stdout
    assert cache.is_dir() and not os.listdir(cache)
    again = kiln_command("cache", "clear", cache_dir=cache)
    assert again.returncode == 0 and "already empty" in again.stdout


def test_report_calls_the_html_report_or_says_it_is_missing(tmp_path):
    from importlib.util import find_spec

    if find_spec("kiln.debug.html_report") is None:  # this branch has no report yet
        result = kiln_command("report", "--", "python", "script.py", cache_dir=tmp_path)
        assert result.returncode == 2
        assert "not available in this version" in result.stderr
    # with the module present, a stand-in shows the arguments reach html_report.main unchanged
    stand_in = tmp_path / "stand_in" / "kiln"
    (stand_in / "debug").mkdir(parents=True)
    (stand_in / "debug" / "html_report.py").write_text(
        "import sys\ndef main(argv):\n    print('report got', argv)\n    return 7\n")
    sitecustomize = tmp_path / "stand_in" / "sitecustomize.py"
    sitecustomize.write_text(  # kiln.debug's path starts with the stand-in's folder
        "import kiln.debug, os\nkiln.debug.__path__.insert(0, os.path.join(os.path.dirname(__file__), 'kiln', 'debug'))\n")
    env = {"PYTHONPATH": f"{tmp_path / 'stand_in'}{os.pathsep}{REPO_ROOT}"}
    found = kiln_command("report", "--", "python", "script.py", cache_dir=tmp_path, extra_env=env)
    assert found.returncode == 7, found.stderr
    assert "report got ['--', 'python', 'script.py']" in found.stdout


def synthetic_results(path):
    def case(workload, backend, mode, times):
        ordered = sorted(times)
        return {"suite": "models", "workload": workload, "backend": backend, "mode": mode, "status": "ok",
                "median_ms": ordered[len(ordered) // 2], "times_ms": times}
    cases = [case("bert", "eager", "infer", [10.0, 11.0, 12.0]), case("bert", "inductor", "infer", [5.0, 5.5, 6.0]),
             case("bert", "kiln", "infer", [4.0, 4.5, 5.0]), case("gpt2", "eager", "infer", [8.0, 8.0, 9.0]),
             case("gpt2", "kiln", "infer", [4.0, 4.0, 4.0]), case("gpt2", "eager", "train", [20.0, 21.0, 22.0]),
             case("gpt2", "kiln", "train", [10.0, 10.5, 11.0]),
             {"suite": "models", "workload": "llama", "backend": "kiln", "mode": "infer", "status": "timeout"}]
    path.write_text(json.dumps({"environment": {"gpu": "Test GPU", "torch": "2.13", "git_commit": "abc1234"},
                                "plan": {}, "cases": cases}))
    return path


def test_speedups_are_over_eager_in_the_same_mode_family(tmp_path):
    from kiln.cli.plots import speedups

    table = speedups(json.loads(synthetic_results(tmp_path / "r.json").read_text())["cases"])
    assert table == {("inductor", "infer"): {"bert": 2.0}, ("kiln", "infer"): {"bert": 11.0 / 4.5, "gpt2": 2.0},
                     ("kiln", "train"): {"gpt2": 2.0}}


def test_bench_plot_redraws_the_plots_of_a_results_file(tmp_path):
    pytest.importorskip("matplotlib")
    results = synthetic_results(tmp_path / "2026-01-01_models_test.json")
    result = kiln_command("bench", "--plot", str(results), cache_dir=tmp_path / "cache")
    assert result.returncode == 0, result.stderr
    for name in ("speedup", "times"):
        png, svg = tmp_path / f"2026-01-01_models_test_{name}.png", tmp_path / f"2026-01-01_models_test_{name}.svg"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
        assert "<svg" in svg.read_text()
        assert f"plot: {png}" in result.stdout
    assert "bert" in (tmp_path / "2026-01-01_models_test_speedup.svg").read_text()


def test_bench_without_matplotlib_says_so_and_skips_the_plots(tmp_path):
    results = synthetic_results(tmp_path / "r.json")
    blocker = tmp_path / "blocker"
    blocker.mkdir()
    (blocker / "matplotlib.py").write_text("raise ImportError('No module named matplotlib')\n")
    env = {"PYTHONPATH": f"{blocker}{os.pathsep}{REPO_ROOT}"}
    result = kiln_command("bench", "--plot", str(results), cache_dir=tmp_path / "cache", extra_env=env)
    assert result.returncode == 0, result.stderr
    assert "matplotlib is not installed" in result.stdout
    assert not list(tmp_path.glob("*.png"))


def test_bench_outside_a_checkout_points_at_the_repository(tmp_path):
    # an installed kiln: the package alone, no benchmarks/ beside it or in the working directory
    installed = tmp_path / "site"
    installed.mkdir()
    os.symlink(os.path.join(REPO_ROOT, "kiln"), installed / "kiln")
    result = kiln_command("bench", "--small", cache_dir=tmp_path / "cache", cwd=tmp_path,
                          extra_env={"PYTHONPATH": str(installed)})
    assert result.returncode == 2
    assert "not importable" in result.stderr and "kiln checkout" in result.stderr
    assert "--plot" in result.stderr


def test_a_verify_check_runs_the_triton_kernels_and_fails_what_kiln_did_not_compile(tmp_path):
    import torch

    import kiln
    from kiln.cli.verify import PROGRAMS, Program, Target, check

    with kiln.config.patch(cache_dir=str(tmp_path)):
        assert check(PROGRAMS[0], Target("cpu, Triton interpreter", "cpu", "triton")) == \
            (True, "1 graph, 1 kernel, matches eager")
        view_only = Program("view", lambda device: (lambda x: x.view(-1), (torch.randn(3, 4),)))
        assert check(view_only, Target("cpu, C++", "cpu")) == (False, "no kernel was generated")
        untraceable = Program("nonzero", lambda device: (torch.nonzero, (torch.randn(3, 4),)))
        passed, message = check(untraceable, Target("cpu, C++", "cpu"))
        assert not passed and message.startswith("compile or run failed:") and "\n" not in message


def test_bench_runs_the_harness_and_plots_what_it_wrote(tmp_path):
    pytest.importorskip("matplotlib")
    harness_help = kiln_command("bench", "--harness-help", cache_dir=tmp_path / "cache")
    assert harness_help.returncode == 0 and "--suite" in harness_help.stdout  # benchmarks/run.py's own options
    result = kiln_command("bench", "--small", "--only", "cnn", "--backends", "eager", "--modes", "infer",
                          "--iterations", "3", "--results-dir", str(tmp_path / "results"), "--label", "t",
                          cache_dir=tmp_path / "cache")
    assert result.returncode == 0, result.stdout + result.stderr
    written = sorted(os.listdir(tmp_path / "results"))
    stem = next(name for name in written if name.endswith(".json"))[:-len(".json")]
    # eager only: no speedup to draw, but the per-call times are
    assert f"{stem}_times.png" in written and f"{stem}_times.svg" in written
    assert f"plot: {tmp_path / 'results' / stem}_times.png" in result.stdout
