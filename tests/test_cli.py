"""The command line: python -m orion {demo, constraints, generate} and python -m orion.bench decode."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import orion
from orion import probes
from orion.models import GPT2Config
from orion.models.gpt2.weights import save_hf
from support.gpt2_fixtures import lively_weights
from support.signals import default_sigint
from support.text_fixtures import write_model_dir

CONFIG = GPT2Config(n_layer=2, n_head=4, n_embd=64, vocab_size=512, n_positions=128)
TIMING = re.compile(r"\d+ prompt tokens, \d+ completion tokens, time to first token \d+\.\d{3} s, "
                    r"(\d+\.\d|-) tok/s \(finish_reason (stop|length)\)")


def run(*args: str, cwd: Path | None = None, stdin: str | None = None, **env: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "ORION_CACHE_DIR": "off", **env}
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=300, env=env, cwd=cwd,
                          input=stdin if stdin is not None else "")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """A small GPT-2 directory in the Hugging Face layout, with a byte-level BPE tokenizer.json."""
    return write_model_dir(tmp_path_factory.mktemp("gpt2"), CONFIG)


def test_bench_decode_json(model_dir) -> None:
    out = run("orion.bench", "decode", "--model", str(model_dir), "--prompt-tokens", "5", "--new-tokens", "8", "--json")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["backend"] == orion.backend() and result["decode_tok_s"] > 0
    assert 20 < result["cached_start_peak_rss_mib"] < 4096  # a fresh process's, read from /proc
    layer_programs = -(-CONFIG.n_layer // result["fusion_depth"])
    assert result["dispatches_per_token"] == layer_programs + 1  # plus one LM-head chunk
    assert "compiled 2 programs for GPT-2" in out.stderr and "program for GPT-2 prompts up to" in out.stderr


def test_bench_decode_of_a_random_shape_loads_its_checkpoint_in_both_processes() -> None:
    """Without --model, the bench writes the shape's random weights as a checkpoint and both processes load it: the
    new process reading the program cache starts as a user's second start does (every program read, none built),
    on the weights of ``models.random`` (the same greedy tokens)."""
    import numpy as np

    from orion import models
    from orion.bench.decode import measure_decode
    from orion.bench.decode import run as bench_run

    result = bench_run(shape=CONFIG, prompt_tokens=3, new_tokens=4, progress=False)
    assert result["cached_start_built"] == 0 and result["programs"] > 0
    prompt = [int(t) for t in np.random.default_rng(0).integers(0, CONFIG.vocab_size, 3)]
    assert result["tokens"] == measure_decode(models.random(CONFIG, seed=0, progress=False), prompt, 4)["tokens"]


def test_bench_decode_report(model_dir) -> None:
    out = run("orion.bench", "decode", "--model", str(model_dir), "--prompt-tokens", "3", "--new-tokens", "4")
    assert out.returncode == 0, out.stderr
    for field in ("backend", "compile", "prefill", "decode", "dispatches/token", "bytes/token", "p90"):
        assert field in out.stdout


def test_bench_decode_int8_says_it_uses_the_permissive_profile(model_dir, tmp_path) -> None:
    out = run("orion.bench", "decode", "--model", str(model_dir), "--prompt-tokens", "5", "--new-tokens", "8",
              "--quant", "int8", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["quant"] == "int8"
    assert "disputed on the ANE (ANE-35); using profile='permissive'" in out.stderr
    report = tmp_path / "emulator-report.json"  # an emulator probe report relaxes nothing: refused, saying how
    report.write_text(json.dumps({"schema": probes.SCHEMA, "backend": "emulator", "probes": {}}))
    out = run("orion.bench", "decode", "--model", str(model_dir), "--new-tokens", "2", "--quant", "int8",
              "--probe-report", str(report))
    assert out.returncode != 0 and "ANE-35" in out.stderr and "profile='permissive'" in out.stderr


def test_generate_with_int8_weights(model_dir) -> None:
    out = run("orion", "generate", "--model", str(model_dir), "--prompt", "hello world", "--max-new-tokens", "6",
              "--quant", "int8")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("hello world") and "ANE-35" in out.stderr


def test_generate_streams_text(model_dir) -> None:
    out = run("orion", "generate", "--model", str(model_dir), "--prompt", "hello world", "--max-new-tokens", "6")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("hello world") and len(out.stdout.strip()) > len("hello world")


def test_generate_speculative_prints_the_same_text_and_its_acceptance(model_dir) -> None:
    prompt = "the cat sat on the mat. the cat sat on the mat. the cat"
    plain = run("orion", "generate", "--model", str(model_dir), "--prompt", prompt, "--max-new-tokens", "12",
                "--ignore-eos")
    spec = run("orion", "generate", "--model", str(model_dir), "--prompt", prompt, "--max-new-tokens", "12",
               "--ignore-eos", "--speculative", "prompt-lookup", "--draft-tokens", "4", "--ngram", "2")
    assert plain.returncode == 0 and spec.returncode == 0, spec.stderr
    assert spec.stdout == plain.stdout
    assert re.search(r"speculative: \d+ checks, \d+ of \d+ drafted tokens accepted", spec.stderr), spec.stderr
    bad = run("orion", "generate", "--model", str(model_dir), "--prompt", "x", "--speculative", "medusa")
    assert bad.returncode == 2 and "prompt-lookup" in bad.stderr


def test_generate_stops_at_zero_new_tokens(model_dir) -> None:
    out = run("orion", "generate", "--model", str(model_dir), "--prompt", "hello", "--max-new-tokens", "0")
    assert out.returncode == 0, out.stderr
    assert out.stdout == "hello\n"


def test_generate_without_tokenizer_explains(tmp_path) -> None:
    save_hf(tmp_path, CONFIG, lively_weights(CONFIG, seed=1))
    out = run("orion", "generate", "--model", str(tmp_path), "--prompt", "hi")
    assert out.returncode == 1 and "tokenizer.json" in out.stderr


def test_constraints_table_lists_every_id() -> None:
    from orion import constraints

    out = run("orion", "constraints")
    assert out.returncode == 0
    assert all(c.id in out.stdout for c in constraints.CATALOG)


def test_demo_runs_and_checks_itself() -> None:
    out = run("orion", "demo", "--iterations", "2")
    assert out.returncode == 0, out.stderr
    assert "OK" in out.stdout and "GFLOP/s" in out.stdout


BAD_COMMAND_LINES = [
    (("orion", "generate", "--model", "{missing}", "--prompt", "hi"), 1, "no such directory"),
    (("orion", "generate", "--model", "{dir}", "--prompt", "hi", "--temperature", "-1"), 1, "temperature=-1"),
    (("orion", "generate", "--model", "{dir}", "--prompt", "hi", "--max-new-tokens", "-2"), 2, "-2 is below 0"),
    (("orion", "generate", "--model", "{unknown}", "--prompt", "hi"), 1, "model_type 'mamba'"),
    (("orion", "demo", "--iterations", "0"), 2, "0 is below 1"),
    (("orion", "demo", "--lanes", "7", "--iterations", "1"), 1, "ANE-14"),
    (("orion.bench", "decode", "--model", "{dir}", "--prompt-tokens", "0"), 2, "0 is below 1"),
    (("orion.bench", "decode", "--model", "{dir}", "--prompt-tokens", "100", "--new-tokens", "100"), 1,
     "exceed the model's context length 128"),
    (("orion.bench", "decode", "--model", "{unknown}"), 1, "model_type 'mamba'"),
    (("orion.bench", "decode", "--random", "nope"), 2, "invalid choice: 'nope'"),
    (("orion.bench", "decode", "--model", "{dir}", "--fusion-depth", "two"), 2, "'two' is not an integer"),
    (("orion", "generate", "--model", "{dir}", "--prompt", "hi", "--prompt-file", "x"), 2, "not allowed with"),
]


@pytest.fixture(scope="module")
def bad_command_runs(model_dir, tmp_path_factory) -> list[subprocess.Popen]:
    """Every BAD_COMMAND_LINES case started at once, each in its own process (they are interpreter starts)."""
    tmp = tmp_path_factory.mktemp("bad_lines")
    unknown = tmp / "unknown"
    unknown.mkdir()
    (unknown / "config.json").write_text(json.dumps({"model_type": "mamba"}))
    paths = {"missing": str(tmp / "missing"), "dir": str(model_dir), "unknown": str(unknown)}
    env = {**os.environ, "ORION_CACHE_DIR": "off"}
    runs = [subprocess.Popen([sys.executable, "-m", *(a.format(**paths) for a in args)], stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
            for args, _, _ in BAD_COMMAND_LINES]
    yield runs
    for process in runs:
        process.kill()
        process.wait()


@pytest.mark.parametrize("case", range(len(BAD_COMMAND_LINES)), ids=[c[2] for c in BAD_COMMAND_LINES])
def test_bad_command_lines_explain_without_a_traceback(bad_command_runs, case) -> None:
    _, status, message = BAD_COMMAND_LINES[case]
    _, stderr = bad_command_runs[case].communicate(timeout=300)
    assert (bad_command_runs[case].returncode, "Traceback" in stderr) == (status, False), stderr
    assert message in stderr


def test_doctor_reports_an_unusable_cache_dir_and_an_unwritable_report(tmp_path) -> None:
    file = tmp_path / "plain"
    file.write_text("")
    env = {**os.environ, "ORION_CACHE_DIR": str(file)}
    out = subprocess.run([sys.executable, "-m", "orion", "doctor"], capture_output=True, text=True, timeout=300,
                         env=env, check=False)
    assert out.returncode == 0 and "Traceback" not in out.stderr
    assert "unusable: ORION_CACHE_DIR=" in out.stdout and "models:" in out.stdout and "gpt2" in out.stdout
    out = run("orion", "doctor", "--probe", "--out", str(tmp_path / "missing" / "report.json"))
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "cannot write the probe report" in out.stderr


# -- generate: checks before compiling, prompt sources, stops, echo, progress, quiet ------------------------
def test_generate_checks_arguments_model_and_tokenizer_before_compiling(model_dir, tmp_path) -> None:
    bare = write_model_dir(tmp_path / "bare", CONFIG, tokenizer=False)
    (tmp_path / "file").write_text("x")
    cases = [
        (["--model", str(model_dir), "--prompt", "hi", "--temperature", "-1"], "temperature=-1"),
        (["--model", str(model_dir), "--prompt", "hi", "--top-p", "1.5"], "top_p=1.5"),
        (["--model", str(bare), "--prompt", "hi"], "no tokenizer.json"),
        (["--model", str(tmp_path / "file"), "--prompt", "hi"], "a file, not a directory"),
        (["--model", str(model_dir), "--prompt", "hi", "--chat"], "no chat_template"),
        (["--model", str(model_dir), "--prompt-file", str(tmp_path / "missing.txt")], "--prompt-file"),
    ]
    for args, message in cases:
        out = run("orion", "generate", *args)
        assert out.returncode == 1 and out.stdout == "", (args, out.stderr)
        assert out.stderr.startswith("error: ") and message in out.stderr and "compil" not in out.stderr, out.stderr


def test_generate_prompt_sources_stop_and_no_echo(model_dir, tmp_path) -> None:
    from orion import models as orion_models

    model = orion_models.load(model_dir, progress=False)
    want = "".join(model.generate_text("hello world", 12))
    out = run("orion", "generate", "--model", str(model_dir), "--prompt", "hello world", "--max-new-tokens", "12")
    assert out.returncode == 0 and out.stdout == "hello world" + want + "\n"
    (tmp_path / "prompt.txt").write_text("hello world", encoding="utf-8")
    from_file = run("orion", "generate", "--model", str(model_dir), "--prompt-file", str(tmp_path / "prompt.txt"),
                    "--max-new-tokens", "12", "--no-echo")
    from_stdin = run("orion", "generate", "--model", str(model_dir), "--max-new-tokens", "12", "--no-echo",
                     stdin="hello world")
    assert from_file.stdout == from_stdin.stdout == want + "\n"
    stop = want[len(want) // 2: len(want) // 2 + 2]
    stopped = run("orion", "generate", "--model", str(model_dir), "--prompt", "hello world", "--max-new-tokens", "12",
                  "--stop", stop, "--no-echo")
    assert stopped.returncode == 0 and stopped.stdout == want[: want.index(stop)] + "\n"


def test_stop_values_understand_shell_escapes() -> None:
    from orion.__main__ import _unescape

    assert _unescape(["\\n", "a\\tb", "\\\\n", "café"]) == ["\n", "a\tb", "\\n", "café"]
    assert _unescape(None) is None


def test_an_empty_prompt_starts_from_bos(model_dir) -> None:
    out = run("orion", "generate", "--model", str(model_dir), "--prompt", "", "--max-new-tokens", "4")
    assert out.returncode == 0, out.stderr
    assert len(out.stdout) > 1


def test_progress_is_one_summary_line_per_batch_and_quiet_is_silent(model_dir) -> None:
    out = run("orion", "generate", "--model", str(model_dir), "--prompt", "hello", "--max-new-tokens", "3")
    lines = out.stderr.splitlines()
    assert out.returncode == 0 and len(lines) == 3, out.stderr
    assert lines[0].startswith("compiled 2 programs for GPT-2 (0.1M parameters, 2 layers) on ")
    assert lines[1].startswith("compiled 1 program for GPT-2 prompts up to 32 tokens in ")
    assert TIMING.fullmatch(lines[2]), lines[2]  # what llama-cli prints after a generation; --quiet drops it
    assert "\r" not in out.stderr and "(2 built, 0 loaded from cache)" in lines[0]
    quiet = run("orion", "generate", "--model", str(model_dir), "--prompt", "hello", "--max-new-tokens", "3",
                "--quiet")
    assert quiet.returncode == 0 and quiet.stderr == "" and quiet.stdout == out.stdout


def test_progress_line_updates_in_place_on_a_terminal() -> None:
    from orion.progress import ProgressLine
    from support.terminal import Terminal

    term = Terminal()
    line = ProgressLine(stream=term)
    line.start("compiling 3 programs for X", 3)
    for detail in ("decode layers 0-0", "decode layers 1-1 (loaded from cache)", "lm_head vocab 0-511"):
        line.step(detail)
    line.finish("compiled 3 programs for X in {seconds}")
    text = term.getvalue()
    assert text.count("\n") == 1 and text.endswith(" s\n")
    assert "\r\x1b[Kcompiling 3 programs for X 2/3: decode layers 1-1 (loaded from cache)" in text
    silent = Terminal()
    off = ProgressLine(False, stream=silent)
    off.start("x", 1)
    off.step("y")
    off.finish("z")
    assert silent.getvalue() == ""


def test_expected_errors_mid_run_end_cleanly(model_dir, tmp_path) -> None:
    (tmp_path / "long.txt").write_text("hello world " * 200)
    out = run("orion", "generate", "--model", str(model_dir), "--prompt-file", str(tmp_path / "long.txt"))
    assert out.returncode == 1 and "Traceback" not in out.stderr and out.stdout == ""
    assert out.stderr.startswith("error: the prompt has ") and "more than the model's context length 128" in out.stderr
    assert "compil" not in out.stderr  # found before compiling
    for args in (("--model", str(model_dir)), ("--random", "gpt2")):  # the bench too, 124M included
        bench = run("orion.bench", "decode", *args, "--prompt-tokens", "1000", "--new-tokens", "100")
        assert bench.returncode == 1 and bench.stderr.startswith("error: --prompt-tokens 1000 + --new-tokens 100")
        assert "compil" not in bench.stderr and "Traceback" not in bench.stderr


def test_ctrl_c_exits_cleanly(model_dir) -> None:
    import signal
    import time

    from orion.cli import report_errors

    def interrupted() -> int:
        raise KeyboardInterrupt

    assert report_errors(interrupted) == 130
    code = ("import sys, orion.__main__ as cli; print('ready', flush=True); "
            f"sys.exit(cli.main(['generate', '--model', {str(model_dir)!r}, '--prompt', '-']))")
    env = {**os.environ, "ORION_CACHE_DIR": "off"}
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, preexec_fn=default_sigint)
    assert proc.stdout.readline() == "ready\n"
    time.sleep(1.0)  # now waiting for the prompt on stdin, which never comes
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and err == "interrupted\n" and out == "", err


def _options(parser) -> list:
    import argparse

    return [a for a in parser._actions if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))]


def test_every_option_has_help_and_its_default_once() -> None:
    """Each option's help says its default once: appended as (default: X), or in the help's own words
    ("None: ..."); never twice, and never a meaningless (default: None) or a flag's (default: False)."""
    import argparse

    from orion.__main__ import build_parser
    from orion.bench.decode import build_parser as bench_parser
    from orion.cli import HelpFormatter
    from orion.repl import build_parser as chat_parser
    from orion.serve.cli import build_parser as serve_parser

    main = build_parser()
    commands = next(a for a in main._actions if isinstance(a, argparse._SubParsersAction)).choices
    for name, parser in [("generate", commands["generate"]), ("doctor", commands["doctor"]),
                         ("bench decode", bench_parser()), ("serve", serve_parser()), ("chat", chat_parser())]:
        text = parser.format_help()
        assert "(default: None)" not in text and "(default: False)" not in text, name
        for action in _options(parser):
            assert action.help, f"{name} {action.option_strings} has no help"
            own = action.help.lower()
            shown = HelpFormatter(name)._get_help_string(action) % {"default": action.default}
            assert shown.count("(default:") <= 1, (name, shown)
            if shown != action.help:  # appended: then the help's own words do not say it as well
                assert "default" not in own and "none:" not in own, (name, shown)
            if action.default not in (None, False, argparse.SUPPRESS):
                assert "(default:" in shown or "default" in own, (name, shown)
    for flag in ("--stop", "--prompt-file", "--no-echo", "--chat", "--quiet", "--min-p", "--repetition-penalty"):
        assert flag in commands["generate"].format_help()
    top = run("orion", "--help")
    assert top.returncode == 0 and "Apple Neural Engine" in top.stdout and "``" not in top.stdout
    bench = run("orion.bench", "--help")
    assert bench.returncode == 0 and "decode" in bench.stdout and "usage:" in bench.stdout


# -- bench: cold start in a temporary cache by default, warm start in a kept one ---------------------------
def test_bench_second_run_in_the_same_cache_is_warm_and_default_leaves_nothing(model_dir, tmp_path) -> None:
    user_cache = tmp_path / "user-cache"
    kept = tmp_path / "kept"
    args = ("orion.bench", "decode", "--model", str(model_dir), "--prompt-tokens", "3", "--new-tokens", "2")
    first = run(*args, "--cache", str(kept), ORION_CACHE_DIR=str(user_cache))
    second = run(*args, "--cache", str(kept), ORION_CACHE_DIR=str(user_cache))
    assert first.returncode == second.returncode == 0, first.stderr + second.stderr
    assert "start              cold: " in first.stdout and "0 of 3 programs loaded" in first.stdout
    assert "start              warm: " in second.stdout and "3 of 3 programs loaded" in second.stdout
    default = run(*args, "--json", ORION_CACHE_DIR=str(user_cache))
    result = json.loads(default.stdout)
    assert result["start"] == "cold" and result["cache"].startswith("temporary")
    assert not user_cache.exists()  # nothing written to the user's cache


# -- doctor ---------------------------------------------------------------------------------------------
def test_doctor_reports_backend_errors_threads_simd_and_cache(tmp_path) -> None:
    bad = run("orion", "doctor", ORION_BACKEND="bogus")
    assert bad.returncode == 1 and "Traceback" not in bad.stderr
    assert "backend:         ERROR: ORION_BACKEND='bogus' is not a backend" in bad.stdout
    good = run("orion", "doctor", ORION_CACHE_DIR=str(tmp_path))
    assert good.returncode == 0, good.stderr
    for field in ("threads (ORION_NUM_THREADS), SIMD", "program cache:   " + str(tmp_path) + ": 0 programs, 0.0 MB",
                  "docs/hardware.md"):
        assert field in good.stdout
    assert "FACTS" not in good.stdout


def test_doctor_probe_on_the_emulator_is_labelled_and_gives_no_advice_to_use_it(tmp_path) -> None:
    out = run("orion", "doctor", "--probe", "--out", str(tmp_path / "r.json"))
    assert out.returncode == 0, out.stderr
    assert "(emulator rules, not hardware)" in out.stdout and "FACTS" not in out.stdout
    assert "probe_report=" not in out.stdout


def test_progress_never_interleaves_with_the_generated_text(model_dir) -> None:
    env = {**os.environ, "ORION_CACHE_DIR": "off"}
    out = subprocess.run([sys.executable, "-m", "orion", "generate", "--model", str(model_dir), "--prompt", "hello",
                          "--max-new-tokens", "5"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env=env, timeout=300, stdin=subprocess.DEVNULL)
    lines = out.stdout.splitlines()
    assert out.returncode == 0 and len(lines) == 4, out.stdout
    assert lines[0].startswith("compiled 2 programs") and lines[1].startswith("compiled 1 program")
    assert lines[2].startswith("hello")  # the prompt's bucket is compiled before the prompt is echoed
    assert TIMING.fullmatch(lines[3]), lines[3]  # after the text


def test_serve_data_and_train_are_commands_of_their_own(tmp_path) -> None:
    """``python -m orion serve|data ...`` runs those modules' command lines with the rest of the arguments."""
    listed = run("orion", "--help")
    assert listed.returncode == 0 and all(name in listed.stdout for name in ("serve", "data", "train"))
    assert "--steps" in run("orion", "train", "--help").stdout
    assert "--max-queue" in run("orion", "serve", "--help").stdout
    text = tmp_path / "a.txt"
    text.write_text("the neural engine runs the model one token at a time\n" * 50, encoding="utf-8")
    out = run("orion", "data", "prepare", str(text), "--out", str(tmp_path / "data"), "--vocab-size", "300")
    assert out.returncode == 0, out.stderr
    assert {"train.bin", "val.bin", "tokenizer.json", "meta.json"} <= {p.name for p in (tmp_path / "data").iterdir()}
    missing = run("orion", "serve", "--model", str(tmp_path / "nowhere"))
    assert missing.returncode != 0 and "Traceback" not in missing.stderr
