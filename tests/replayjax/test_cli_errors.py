"""Every `replayjax` subcommand refuses bad input as a user needs it: run in-process through
`replayjax.cli.main`, each case of the tables below must end within its time limit with the
expected exit status (2: a flag, refused while parsing; 1: an input file or directory, refused
before any heavy work) and exactly one line on stderr, `replayjax COMMAND: error: ...`, naming
the culprit (the flag, the file) -- never a traceback, never output on stdout.

Unexpected exceptions are one line with their type and a pointer to --debug (which shows the
traceback); Ctrl-C is one line and exit status 130; a failed run leaves no output file or
temporary directory behind. Parse-time refusals import neither jax nor a model (checked in a
fresh interpreter)."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from replayjax import cli

FIX = "tests/fixtures/hf"
NEMOTRON = f"{FIX}/nemotron_h"           # vocab 128, no MTP tensors, no tokenizer.json
QWEN = f"{FIX}/qwen3_5"
PARSE_S, INPUT_S, LOAD_S = 10, 30, 120  # time limits: parsing, input checks, model loading


class Timeout(BaseException):
    """Not an Exception: the command's own handler must not turn it into an error line."""


def invoke(argv, limit, capsys):
    """(exit status, stdout, stderr) of `replayjax ARGV`, failing past `limit` seconds."""
    def expire(*_):
        raise Timeout(f"replayjax {' '.join(argv)} ran past {limit} s")
    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, limit)
    try:
        try:
            code = cli.main(argv)
        except SystemExit as e:
            code = e.code
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    out, err = capsys.readouterr()
    return code, out, err


def assert_refused(argv, code, culprit, limit, capsys):
    """One error line naming `culprit`, status `code`, nothing on stdout, in time."""
    t0 = time.perf_counter()
    got, out, err = invoke(argv, limit, capsys)
    lines = err.splitlines()
    assert got == code, f"exit {got}, want {code}: {err}"
    assert len(lines) == 1, f"want one line on stderr, got:\n{err}"
    assert "Traceback" not in err and out == "", (out, err)
    assert re.match(r"replayjax( [a-z]+)*: error: ", lines[0]), lines[0]
    assert culprit in lines[0], f"{culprit!r} not named in: {lines[0]}"
    assert time.perf_counter() - t0 < limit


# ---------------------------------------------------------------------- flags (exit 2)

GEN = ["generate", "--prompt-ids", "1,2"]
PARSE_CASES = [
    # generate: every numeric flag out of range, wrong types, NaN / inf, empty strings
    (GEN + ["--num-slots", "0"], "--num-slots"),
    (GEN + ["--num-slots", "-1"], "--num-slots"),
    (GEN + ["--num-slots", "1.5"], "--num-slots"),
    (GEN + ["--num-slots", ""], "--num-slots"),
    (GEN + ["--max-new-tokens", "0"], "--max-new-tokens"),
    (GEN + ["--max-new-tokens", "many"], "--max-new-tokens"),
    (GEN + ["--max-len", "1"], "--max-len"),
    (GEN + ["--max-len", "32"], "--max-len"),               # no room next to 32 new tokens
    (GEN + ["--steps-per-visit", "0"], "--steps-per-visit"),
    (GEN + ["--steps-per-visit", str(10 ** 20)], "--steps-per-visit"),   # past int32
    (GEN + ["--top-k", str(10 ** 20)], "--top-k"),
    (GEN + ["--num-slots", str(2 ** 31)], "--num-slots"),
    (GEN + ["--temperature", "-1"], "--temperature"),
    (GEN + ["--temperature", "inf"], "--temperature"),
    (GEN + ["--temperature", "-inf"], "--temperature"),
    (GEN + ["--temperature", "-1e3"], "--temperature"),
    (GEN + ["--temperature", "nan"], "--temperature"),
    (GEN + ["--temperature", "warm"], "--temperature"),
    (GEN + ["--temperature", ""], "--temperature"),
    (GEN + ["--top-p", "2"], "--top-p"),
    (GEN + ["--top-p", "0"], "--top-p"),
    (GEN + ["--temperature", "0.8", "--top-p", "-1"], "--top-p"),
    (GEN + ["--top-p", "nan"], "--top-p"),
    (GEN + ["--top-k", "-1"], "--top-k"),
    (GEN + ["--top-k", "2.5"], "--top-k"),
    (GEN + ["--seed", "-1"], "--seed"),
    (GEN + ["--seed", str(2 ** 31)], "--seed"),
    (GEN + ["--window", "0"], "--window"),
    (GEN + ["--window", "12"], "--window"),
    (GEN + ["--window", "128"], "--window"),
    (GEN + ["--ssm-mode", "fast"], "--ssm-mode"),
    (GEN + ["--state-dtype", "float16"], "--state-dtype"),
    (GEN + ["--speculative", "eagle"], "--speculative"),
    (GEN + ["--speculative", "draft"], "--speculative"),
    (GEN + ["--speculative", "draft:"], "--speculative"),
    (GEN + ["--speculative", ""], "--speculative"),
    (GEN + ["--num-draft", "2"], "--num-draft"),            # without --speculative
    (GEN + ["--speculative", "none", "--num-draft", "2"], "--num-draft"),
    (GEN + ["--speculative", "mtp", "--num-draft", "0"], "--num-draft"),
    (GEN + ["--speculative", "ngram", "--num-draft", "8"], "--num-draft"),
    (GEN + ["--speculative", "ngram", "--num-draft", "4", "--window", "4"], "--num-draft"),
    (GEN + ["--speculative", "ngram", "--window", "2"], "--num-draft"),  # the default K = 3
    (GEN + ["--stop-ids", "x"], "--stop-ids"),
    (GEN + ["--stop-ids", ""], "--stop-ids"),
    (GEN + ["--save-logits", ""], "--save-logits"),
    (GEN + ["--stream", "--json"], "--stream"),
    (GEN + ["--stream", "--jsonl"], "--stream"),
    (GEN + ["--stream", "--prompt-ids", "3"], "--stream"),
    (GEN + ["--json", "--jsonl"], "--jsonl"),
    (GEN + ["--logprobs", "2"], "--logprobs"),               # without --json / --jsonl
    (GEN + ["--logprobs", "21", "--json"], "--logprobs"),
    (GEN + ["--logprobs", "2", "--json", "--save-logits", "x.npy"], "--logprobs"),
    (GEN + ["--frobnicate"], "--frobnicate"),
    (GEN + ["--max-new-tokens"], "--max-new-tokens"),       # value missing
    (["generate"], "--prompt"),
    (["generate", "--prompt", ""], "--prompt"),
    (["generate", "--prompt", "   "], "--prompt"),
    (["generate", "--prompt", "ab\udcff"], "--prompt"),      # argv bytes that are not UTF-8
    (["generate", "--prompt-ids", ""], "--prompt-ids"),
    (["generate", "--prompt-ids", "1,,2"], "--prompt-ids"),
    (["generate", "--prompt-ids", "a,b"], "--prompt-ids"),
    (["generate", "--prompt-ids", "-1"], "--prompt-ids"),
    (["generate", "--prompt-ids", "1.5"], "--prompt-ids"),
    (["generate", "--prompt", "x", "--model", ""], "--model"),
    # convert
    (["convert"], "HF_DIR"),
    (["convert", "in-only"], "OUT_DIR"),
    (["convert", "a", "b", "--dtype", "float16"], "--dtype"),
    (["convert", "a", "b", "--block-mb", "0"], "--block-mb"),
    (["convert", "a", "b", "--block-mb", "-8"], "--block-mb"),
    (["convert", "a", "b", "--block-mb", "4096"], "--block-mb"),
    (["convert", "a", "b", "--block-mb", "big"], "--block-mb"),
    (["convert", "", "b"], "HF_DIR"),
    (["convert", "a", "b", "c"], "unrecognized arguments: c"),
    # bench
    (["bench"], "--model"),
    (["bench", "--model", NEMOTRON, "--synthetic", "qwen3.5-9b"], "--synthetic"),
    (["bench", "--synthetic", "llama-70b"], "--synthetic"),
    (["bench", "--model", NEMOTRON, "--batch", "0"], "--batch"),
    (["bench", "--model", NEMOTRON, "--batch", "two"], "--batch"),
    (["bench", "--model", NEMOTRON, "--prompt-len", "0"], "--prompt-len"),
    (["bench", "--model", NEMOTRON, "--new-tokens", "-1"], "--new-tokens"),
    (["bench", "--model", NEMOTRON, "--window", "6"], "--window"),
    (["bench", "--model", NEMOTRON, "--num-draft", "9"], "--num-draft"),
    (["bench", "--model", NEMOTRON, "--num-draft", "3"], "--num-draft"),   # nothing drafts
    (["bench", "--model", NEMOTRON, "--variants", "replay+ngram", "--num-draft", "4",
      "--window", "4"], "--num-draft"),
    (["bench", "--model", NEMOTRON, "--variants", "replay+medusa"], "--variants"),
    (["bench", "--model", NEMOTRON, "--variants", "replay", "replay"], "--variants"),
    (["bench", "--model", NEMOTRON, "--variants"], "--variants"),
    (["bench", "--model", NEMOTRON, "--steps-per-visit", "0"], "--steps-per-visit"),
    (["bench", "--model", NEMOTRON, "--seed", "-1"], "--seed"),
    (["bench", "--model", NEMOTRON, "--dtype", "float32"], "--dtype"),     # not synthetic
    (["bench", "--model", NEMOTRON, "--tokenizer", "tok.json"], "--tokenizer"),  # no trace
    (["bench", "--model", NEMOTRON, "--trace", "t.jsonl", "--prompt-len", "8"], "--prompt-len"),
    (["bench", "--model", NEMOTRON, "--trace", "t.jsonl", "--workload", "sync"], "--workload"),
    (["bench", "--model", NEMOTRON, "--trace", "t.jsonl", "--seed", "3"], "--seed"),
    (["bench", "--model", NEMOTRON, "--isolate", "always"], "--isolate"),
    (["bench", "--model", ""], "--model"),
    # bench kernels
    (["bench", "kernels", "--batches", "0"], "--batches"),
    (["bench", "kernels", "--batches"], "--batches"),
    (["bench", "kernels", "--window", "12"], "--window"),
    (["bench", "kernels", "--family", "rwkv"], "--family"),
    (["bench", "kernels", "--family", "gdn", "--shapes", "nemotron-h-8b"], "--shapes"),
    (["bench", "kernels", "--tune", "[1, 2]"], "--tune"),
    (["bench", "kernels", "--tune", "[]"], "--tune"),
    (["bench", "kernels", "--std-config", "{bad"], "--std-config"),
    (["bench", "kernels", "--replay-config", "[1]"], "--replay-config"),
    (["bench", "kernels", "--tune", "[{}]", "--std-config", '{"block_p": 32}'], "--tune"),
    (["bench", "kernels", "--tune", "[{}]", "--batches", "1", "256"], "--batches"),
    (["bench", "kernels", "--ring-dtype", "int8"], "--ring-dtype"),
    (["bench", "kernels", "--impls", "triton"], "--impls"),
    (["bench", "kernelz"], "bench kernelz"),
    # bench verify
    (["bench", "verify", "--tokens", "0"], "--tokens"),
    (["bench", "verify", "--tokens", "9"], "--tokens"),
    (["bench", "verify", "--tokens", "8", "--window", "4"], "--tokens"),
    (["bench", "verify", "--batches", "x"], "--batches"),
    (["bench", "verify", "--tune-baseline", "{}"], "--tune-baseline"),
    (["bench", "verify", "--impls", "mosaic"], "--impls"),
    # bench moe
    (["bench", "moe", "--copies", "0"], "--copies"),
    (["bench", "moe", "--batches", "0"], "--batches"),
    (["bench", "moe", "--peak-tflops", "0"], "--peak-tflops"),
    (["bench", "moe", "--peak-tflops", "nan"], "--peak-tflops"),
    (["bench", "moe", "--peak-tflops", "inf"], "--peak-tflops"),
    (["bench", "moe", "--models", "gpt-4"], "--models"),
    (["bench", "moe", "--variants", "cutlass"], "--variants"),
    (["bench", "moe", "--small-tilings", "{}"], "--small-tilings"),
    (["bench", "moe", "--router-tilings", "[]"], "--router-tilings"),
    # bench attention
    (["bench", "attention", "--tokens", "9"], "--tokens"),
    (["bench", "attention", "--max-len", "8"], "--max-len"),
    (["bench", "attention", "--shapes", "gpt-4"], "--shapes"),
    (["bench", "attention", "--tune", "{}"], "--tune"),
    # bench conv
    (["bench", "conv", "--shapes", "gpt-4"], "--shapes"),
    (["bench", "conv", "--batches", "0"], "--batches"),
    (["bench", "conv", "--tune", "{}"], "--tune"),
    # bench prefill
    (["bench", "prefill"], "--model"),
    (["bench", "prefill", "--synthetic", "llama-70b"], "--synthetic"),
    (["bench", "prefill", "--model", NEMOTRON, "--batch", "0"], "--batch"),
    (["bench", "prefill", "--model", NEMOTRON, "--prompt-len", "0"], "--prompt-len"),
    (["bench", "prefill", "--model", NEMOTRON, "--prompt-len", "long"], "--prompt-len"),
    (["bench", "prefill", "--model", NEMOTRON, "--ssm-mode", "fast"], "--ssm-mode"),
    (["bench", "prefill", "--model", NEMOTRON, "--ssm-mode", "replay", "replay"], "--ssm-mode"),
    (["bench", "prefill", "--model", NEMOTRON, "--ssm-mode"], "--ssm-mode"),
    (["bench", "prefill", "--model", NEMOTRON, "--window", "12"], "--window"),
    (["bench", "prefill", "--model", NEMOTRON, "--iterations", "0"], "--iterations"),
    (["bench", "prefill", "--model", NEMOTRON, "--peak-tflops", "0"], "--peak-tflops"),
    (["bench", "prefill", "--model", NEMOTRON, "--peak-tflops", "nan"], "--peak-tflops"),
    (["bench", "prefill", "--model", NEMOTRON, "--tp", "0"], "--tp"),
    (["bench", "prefill", "--model", NEMOTRON, "--dtype", "float32"], "--dtype"),  # not synthetic
    (["bench", "prefill", "--model", ""], "--model"),
    # profile
    (["profile", "--model", NEMOTRON, "--steps", "0"], "--steps"),
    (["profile", "--model", NEMOTRON, "--batch", "0"], "--batch"),
    (["profile", "--model", NEMOTRON, "--prompt-len", "-3"], "--prompt-len"),
    (["profile", "--model", NEMOTRON, "--window", "10"], "--window"),
    (["profile", "--model", NEMOTRON, "--top", "0"], "--top"),
    (["profile", "--model", NEMOTRON, "--seed", "x"], "--seed"),
    (["profile", "--model", NEMOTRON, "--mode", "fast"], "--mode"),
    (["profile", "--model", NEMOTRON, "--dtype", "float32"], "--dtype"),
    (["profile", "--model", NEMOTRON, "--trace-dir", ""], "--trace-dir"),
    (["profile"], "--model"),
    # the dispatcher
    (["genrate"], "'genrate'"),
]


@pytest.mark.parametrize("argv,culprit", PARSE_CASES, ids=" ".join)
def test_bad_flag_is_one_line_exit_2(argv, culprit, capsys):
    assert_refused(argv, 2, culprit, PARSE_S, capsys)


def test_parse_errors_import_neither_jax_nor_a_model():
    """All of PARSE_CASES in one fresh interpreter: each exits 2 and jax is never imported."""
    script = (
        "import sys\nfrom replayjax import cli\ncodes = []\n"
        f"for argv in {[a for a, _ in PARSE_CASES]!r}:\n"
        "    try:\n        codes.append(cli.main(argv))\n"
        "    except SystemExit as e:\n        codes.append(e.code)\n"
        "print(codes, sorted(m for m in ('jax', 'flax', 'orbax') if m in sys.modules))\n")
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                         timeout=60, check=True).stdout
    assert out.strip() == f"{[2] * len(PARSE_CASES)} []"


# ---------------------------------------------------------------------- inputs (exit 1)

@pytest.fixture(scope="module")
def bad(tmp_path_factory):
    """Broken inputs: name -> path."""
    root = tmp_path_factory.mktemp("bad")

    def directory(name, files=None):
        d = root / name
        d.mkdir()
        for fname, data in (files or {}).items():
            (d / fname).write_bytes(data) if isinstance(data, bytes) else \
                (d / fname).write_text(data)
        return str(d)

    config = open(f"{NEMOTRON}/config.json").read()
    weights = open(f"{NEMOTRON}/model.safetensors", "rb").read()
    paths = dict(
        empty_dir=directory("empty"),
        config_not_json=directory("config_not_json", {"config.json": "{bad"}),
        config_empty=directory("config_empty", {"config.json": ""}),
        config_wrong=directory("config_wrong", {"config.json": '{"model_type": "llama"}'}),
        no_weights=directory("no_weights", {"config.json": config}),
        weights_random=directory("weights_random", {"config.json": config,
                                                    "model.safetensors": b"\x07" * 5000}),
        weights_truncated=directory("weights_truncated", {"config.json": config,
                                                          "model.safetensors": weights[:3000]}),
        other_files=directory("other_files", {"weights.bin": b"\0" * 16}),
        tokenizer_empty=directory("tokenizer_empty", {"config.json": config,
                                                      "model.safetensors": weights,
                                                      "tokenizer.json": ""}),
        tokenizer_corrupt=directory("tokenizer_corrupt", {"config.json": config,
                                                          "model.safetensors": weights,
                                                          "tokenizer.json": '{"model": 3}'}),
        empty_file=str(root / "empty.jsonl"),
        trace_bad=str(root / "bad.jsonl"),
        trace_text=str(root / "text.jsonl"),
        existing_out=directory("existing_out", {"x": "1"}),
        a_file=str(root / "a_file.txt"),
    )
    (root / "empty.jsonl").write_text("")
    (root / "bad.jsonl").write_text('{"prompt_ids": [1, 2], "max_new_tokens": 0}\n')
    (root / "text.jsonl").write_text('{"prompt": "the cat", "max_new_tokens": 4}\n')
    (root / "a_file.txt").write_text("not a directory")
    return paths


N = ["--model", NEMOTRON]
INPUT_CASES = [   # (argv with {name} for a `bad` path, culprit, time limit)
    # generate: model directories
    (["generate", "--model", "no/such/dir", "--prompt-ids", "1"], "no/such/dir", INPUT_S),
    (["generate", "--model", "{a_file}", "--prompt-ids", "1"], "a_file.txt", INPUT_S),
    (["generate", "--model", f"{NEMOTRON}/config.json", "--prompt-ids", "1"], "config.json",
     INPUT_S),
    (["generate", "--model", "{empty_dir}", "--prompt-ids", "1"], "empty", INPUT_S),
    (["generate", "--model", "{other_files}", "--prompt-ids", "1"], "other_files", INPUT_S),
    (["generate", "--model", "{config_not_json}", "--prompt-ids", "1"], "config.json", INPUT_S),
    (["generate", "--model", "{config_empty}", "--prompt-ids", "1"], "config.json", INPUT_S),
    (["generate", "--model", "{config_wrong}", "--prompt-ids", "1"], "llama", INPUT_S),
    (["generate", "--model", "{no_weights}", "--prompt-ids", "1"], "model.safetensors", INPUT_S),
    (["generate", "--model", "{weights_random}", "--prompt-ids", "1"], "model.safetensors",
     INPUT_S),
    (["generate", "--model", "{weights_truncated}", "--prompt-ids", "1"], "model.safetensors",
     INPUT_S),
    # generate: tokenizer and prompts against the model
    (["generate", *N, "--prompt", "hi"], "tokenizer.json", INPUT_S),
    (["generate", "--model", "{tokenizer_empty}", "--prompt", "hi"], "tokenizer.json", INPUT_S),
    (["generate", "--model", "{tokenizer_corrupt}", "--prompt", "hi"], "tokenizer.json", INPUT_S),
    (["generate", *N, "--prompt-ids", "1,999"], "--prompt-ids", INPUT_S),
    (["generate", *N, "--prompt-ids", "1", "--stop-ids", "128"], "--stop-ids", INPUT_S),
    (["generate", *N, "--prompt-ids", ",".join(["5"] * 60), "--max-len", "64", "--max-new-tokens",
      "8"], "--max-len", INPUT_S),
    (["generate", *N, "--prompt-ids", "1", "--speculative", "mtp"], "--speculative mtp", INPUT_S),
    (["generate", *N, "--prompt-ids", "1", "--speculative", "draft:no/such/dir"],
     "--speculative draft", INPUT_S),
    (["generate", "--prompt", "GNU", "--speculative", f"draft:{NEMOTRON}"], "vocabulary",
     INPUT_S),
    (["generate", *N, "--prompt-ids", "1", "--save-logits", "no/such/dir/x.npy"], "--save-logits",
     INPUT_S),
    (["generate", *N, "--prompt-ids", "1", "--save-logits", "{existing_out}"], "--save-logits",
     INPUT_S),
    # generate: the engine's refusals name the flags
    (["generate", *N, "--prompt-ids", "1", "--prefix-cache-gb", "1", "--prefix-block", "8"],
     "--prefix-block", LOAD_S),
    (["generate", *N, "--prompt-ids", "1", "--prefix-cache-host-gb", "1"],
     "--prefix-cache-host-gb needs --prefix-cache-gb", LOAD_S),
    (["generate", *N, "--prompt-ids", "1", "--prefix-block", "128"],
     "--prefix-block sizes the prefix cache's entries: give --prefix-cache-gb", LOAD_S),
    # generate: a cache that cannot fit is refused before it is allocated
    (["generate", *N, "--prompt-ids", "1", "--prefix-cache-gb", "1e12"], "--prefix-cache-gb",
     LOAD_S),
    (["generate", *N, "--prompt-ids", "1", "--prefix-cache-gb", "1", "--prefix-cache-host-gb",
      "1e9"], "--prefix-cache-host-gb", LOAD_S),
    (["generate", *N, "--prompt-ids", "1", "--num-slots", "1000000", "--max-len", "1000000"],
     "--num-slots", LOAD_S),
    # convert
    (["convert", "no/such/dir", "{empty_dir}/out"], "no/such/dir", INPUT_S),
    (["convert", "{a_file}", "{empty_dir}/out"], "a_file.txt", INPUT_S),
    (["convert", "{empty_dir}", "{empty_dir}/out"], "config.json", INPUT_S),
    (["convert", "{config_not_json}", "{empty_dir}/out"], "config.json", INPUT_S),
    (["convert", "{weights_random}", "{empty_dir}/out"], "model.safetensors", INPUT_S),
    (["convert", NEMOTRON, "{empty_dir}/a/b"], "parent directory", INPUT_S),
    (["convert", NEMOTRON, "{existing_out}"], "existing_out", INPUT_S),
    # bench and profile
    (["bench", "--model", "no/such/dir"], "--model", INPUT_S),
    (["bench", "--model", "{empty_dir}"], "--model", INPUT_S),
    (["bench", "--model", "{config_not_json}"], "--model", INPUT_S),
    (["bench", *N, "--trace", "no/such.jsonl"], "--trace no/such.jsonl", INPUT_S),
    (["bench", *N, "--trace", "{empty_file}"], "empty.jsonl", INPUT_S),
    (["bench", *N, "--trace", "{empty_dir}"], "--trace", INPUT_S),
    (["bench", *N, "--trace", "{trace_bad}"], "bad.jsonl:1", INPUT_S),
    (["bench", *N, "--trace", "{trace_bad}", "--tokenizer", "no/tok.json"], "--tokenizer",
     INPUT_S),
    (["bench", *N, "--trace", "{trace_text}", "--tokenizer", "{tokenizer_corrupt}/tokenizer.json"],
     "tokenizer.json", INPUT_S),
    (["bench", *N, "--trace", "{trace_text}", "--tokenizer", "{tokenizer_empty}/tokenizer.json"],
     "--tokenizer", INPUT_S),
    (["bench", *N, "--batch", "100000000", "--isolate", "none"], "synthetic prompts", LOAD_S),
    (["bench", "kernels", "--json", "no/such/dir/k.json"], "--json", INPUT_S),
    (["bench", "kernels", "--std-config", '{"block_q": 16}'], "--std-config", INPUT_S),
    (["bench", "kernels", "--replay-config", '{"block_p": 0}'], "--replay-config", INPUT_S),
    (["bench", "kernels", "--family", "gdn", "--impls", "pallas_mosaic_gpu", "--replay-config",
      '{"block_v": 64}'], "--replay-config", INPUT_S),
    (["bench", "kernels", "--impls", "pallas_mosaic_gpu", "--std-config", '{"block_p": 64}'],
     "--std-config", INPUT_S),
    (["bench", "kernels", "--batches", "1"], "CUDA GPU", INPUT_S),
    (["bench", "verify", "--tune", '[{"nope": 1}]'], "--tune", INPUT_S),
    (["bench", "verify", "--impls", "pallas_mosaic_gpu", "--tune", '[{"block_p": 64}]'], "--tune",
     INPUT_S),
    (["bench", "verify", "--family", "gdn", "--impls", "pallas_mosaic_gpu", "--tune",
      '[{"block_v": 64}]'], "--tune", INPUT_S),
    (["bench", "verify", "--json", "{empty_dir}"], "--json", INPUT_S),
    (["bench", "moe", "--json", "no/such/dir/m.json"], "--json", INPUT_S),
    (["bench", "conv", "--tune", '[{"block_k": 32}]'], "--tune", INPUT_S),
    (["bench", "conv", "--tune", '[{"block_c": 0}]'], "--tune", INPUT_S),
    (["bench", "conv", "--batches", "1"], "CUDA GPU", INPUT_S),
    (["bench", "moe", "--batches", "1"], "CUDA GPU", INPUT_S),
    (["bench", "moe", "--small-tilings", '[{"block_f": 0}]'], "--small-tilings", INPUT_S),
    (["bench", "moe", "--small-tilings", '[{"block_m": 16}]'], "--small-tilings", INPUT_S),
    (["bench", "moe", "--router-tilings", '[{"logits": "dot"}]'], "--router-tilings", INPUT_S),
    (["bench", "moe", "--router-tilings", '[{"block_d": 16}]'], "--router-tilings", INPUT_S),
    (["bench", "prefill", "--model", "no/such/dir"], "--model", INPUT_S),
    (["bench", "prefill", "--model", "{weights_truncated}"], "--model", INPUT_S),
    (["bench", "prefill", *N, "--tp", "64"], "--tp 64", INPUT_S),
    (["bench", "prefill", *N, "--batch", "1000000", "--prompt-len", "1000000"], "--batch",
     LOAD_S),
    (["profile", "--model", "no/such/dir"], "--model", INPUT_S),
    (["profile", "--model", "{weights_truncated}"], "--model", INPUT_S),
    (["profile", *N, "--trace-dir", "no/such/dir/trace"], "--trace-dir", INPUT_S),
    (["profile", *N, "--trace-dir", "{a_file}"], "--trace-dir", INPUT_S),
    (["profile", *N, "--batch", "1000000", "--prompt-len", "1000000"], "--batch", LOAD_S),
]


@pytest.mark.parametrize("argv,culprit,limit", INPUT_CASES, ids=lambda v: (
    " ".join(v) if isinstance(v, list) else str(v)))
def test_bad_input_is_one_line_exit_1(argv, culprit, limit, bad, capsys):
    argv = [re.sub(r"\{(\w+)\}", lambda m: bad.get(m[1], m[0]), a) for a in argv]
    before = {d: sorted(os.listdir(p)) for d, p in bad.items() if os.path.isdir(p)}
    assert_refused(argv, 1, culprit, limit, capsys)
    assert {d: sorted(os.listdir(p)) for d, p in bad.items() if os.path.isdir(p)} == before


# ---------------------------------------------------------------------- failures mid-run

def test_unexpected_error_is_one_line_with_its_type_unless_debug(monkeypatch, capsys):
    from replayjax import generate_cli

    def boom(*a, **k):
        raise RuntimeError("kernel exploded\nsecond line")
    monkeypatch.setattr(generate_cli, "generate", boom)
    code, out, err = invoke(GEN + N, INPUT_S, capsys)
    assert code == 1 and out == ""
    assert err == ("replayjax generate: error: RuntimeError: kernel exploded (--debug shows the "
                   "traceback)\n")
    with pytest.raises(RuntimeError, match="kernel exploded"):
        cli.main(GEN + N + ["--debug"])


@pytest.mark.parametrize("argv,target", [
    (GEN + N, "replayjax.generate_cli.generate"),
    (["profile", *N], "replayjax.bench.profile.profile"),
    (["bench", *N, "--isolate", "none"], "replayjax.bench.e2e.run"),
])
def test_ctrl_c_is_one_line_exit_130(argv, target, monkeypatch, capsys):
    def interrupted(*a, **k):
        raise KeyboardInterrupt
    monkeypatch.setattr(target, interrupted)
    code, out, err = invoke(argv, INPUT_S, capsys)
    assert code == 130 and err.endswith(": error: interrupted\n") and len(err.splitlines()) == 1


def test_a_failed_save_leaves_no_file(tmp_path, monkeypatch, capsys):
    """--save-logits is written whole or not at all: a failure while writing leaves nothing."""
    import numpy as np

    def half_then_fail(f, arr):
        f.write(b"\x93NUMPY half")
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(np, "save", half_then_fail)
    target = tmp_path / "logits.npy"
    code, _, err = invoke(GEN + N + ["--max-new-tokens", "2", "--max-len", "16", "--num-slots",
                                     "1", "--save-logits", str(target)], LOAD_S, capsys)
    assert code == 1 and "No space left on device" in err and len(err.splitlines()) == 1
    assert os.listdir(tmp_path) == []


def test_a_failed_profile_leaves_no_trace_directory(tmp_path, monkeypatch, capsys):
    from replayjax.bench import profile

    def fail(args, progress):
        os.makedirs(os.path.join(args.trace_dir, "plugins"))      # as the profiler would
        raise RuntimeError("trace failed")
    monkeypatch.setattr(profile, "profile", fail)
    trace = tmp_path / "trace"
    code, _, _ = invoke(["profile", *N, "--trace-dir", str(trace)], INPUT_S, capsys)
    assert code == 1 and os.listdir(tmp_path) == []
    made = []
    monkeypatch.setattr(profile.tempfile, "mkdtemp",
                        lambda prefix: made.append(str(tmp_path / "tmp")) or made[-1])
    code, _, _ = invoke(["profile", *N], INPUT_S, capsys)
    assert code == 1 and made and os.listdir(tmp_path) == []


def test_convert_json_failure_is_a_json_object_too(bad, capsys):
    code, out, err = invoke(["convert", bad["empty_dir"], bad["empty_dir"] + "/out", "--json"],
                            INPUT_S, capsys)
    assert code == 1 and len(err.splitlines()) == 1
    assert json.loads(out) == {"ok": False, "error": err.split(": error: ", 1)[1].strip()}
