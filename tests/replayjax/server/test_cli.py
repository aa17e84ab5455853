"""`replayjax serve` command line: bad flags exit 2 with one line at parse time, model problems
exit 1 with one line, before anything is served (no model compiles here)."""

import json
import shutil
import socket

import pytest

from replayjax.demo import model_dir
from replayjax.server import cli


@pytest.mark.parametrize("argv,msg", [
    (["--port", "0"], "argument --port: must be in [1, 65535], got 0"),
    (["--port", "http"], "argument --port: expected an integer"),
    (["--num-slots", "0"], "argument --num-slots: must be >= 1"),
    (["--max-queue", "-1"], "argument --max-queue: must be >= 1"),
    (["--max-len", "8"], "argument --max-len: must be >= 16"),
    (["--window", "3"], "argument --window: must be a power of two"),
    (["--speculative", "eagle"], "expected none, ngram, mtp or draft:DIR"),
    (["--speculative", "draft:"], "expected none, ngram, mtp or draft:DIR"),
    (["--num-draft", "2"], "--num-draft: needs --speculative"),
    (["--speculative", "ngram", "--num-draft", "9"], "--num-draft: must be <= 7"),
    (["--speculative", "ngram", "--window", "1"], "needs --window >= 2"),
    (["--shutdown-timeout", "-1"], "--shutdown-timeout: must be a finite number >= 0"),
    (["--shutdown-timeout", "inf"], "--shutdown-timeout: must be a finite number >= 0"),
    (["--max-request-mb", "0"], "--max-request-mb: must be a finite number > 0"),
    (["--served-model-name", " "], "--served-model-name: must not be empty"),
    (["--ssm-mode", "fast"], "argument --ssm-mode: invalid choice"),
    (["--synthetic", "gpt-9"], "argument --synthetic: invalid choice"),
    (["--synthetic", "nemotron-h-8b", "--model", "m"], "not allowed with argument --synthetic"),
    (["--dtype", "float32"], "argument --dtype: only with --synthetic"),
    (["--warmup", "none"], "argument --warmup: invalid choice"),
    (["--tool-call-format", "json"], "argument --tool-call-format: invalid choice"),
    (["--max-logprobs", "21"], "argument --max-logprobs: must be in [0, 20], got 21"),
    (["--reasoning", "on"], "argument --reasoning: invalid choice"),
])
def test_bad_flags_exit_2(argv, msg, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and msg in err and len(err.strip().splitlines()) == 1, err


def broken_template(tmp_path):
    d = tmp_path / "model"
    shutil.copytree(model_dir(), d)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    (d / "tokenizer_config.json").write_text(json.dumps({**cfg, "chat_template": "{% if %}"}))
    return str(d)


@pytest.mark.parametrize("argv,msg", [
    (["--model", "/nonexistent"], "--model /nonexistent: no such directory"),
    (["--chat-template", "/nonexistent.jinja"], "--chat-template /nonexistent.jinja: no such file"),
    (["--model", "tests/fixtures/hf/nemotron_h"], "tokenizer.json does not exist"),
    (["--speculative", "draft:/nonexistent"],
     "--speculative draft: model directory '/nonexistent' does not exist"),
    (None, "chat_template: line 1"),
    (["--prefix-cache-gb", "1", "--prefix-block", "8"], "--prefix-block must be a power of two"),
])
def test_model_problems_exit_1(argv, msg, tmp_path, capsys):
    argv = argv or ["--model", broken_template(tmp_path)]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert cli.main(argv + ["--port", str(port)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("replayjax serve: ") and msg in err[-1], err
    assert not any("Traceback" in line for line in err)


def test_a_taken_port_exits_1(capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        assert cli.main(["--port", str(s.getsockname()[1])]) == 1
    err = capsys.readouterr().err
    assert "cannot listen on 127.0.0.1:" in err and "Traceback" not in err


def test_synthetic_model_serves_every_token_as_text(monkeypatch):
    """--synthetic builds a random model of the preset's dimensions (a tiny preset here) whose
    tokenizer gives every id of its vocabulary a visible text, so load tests see each token."""
    from replayjax.bench import synthetic
    from replayjax.engine import Request
    tiny = dict(model_type="nemotron_h", vocab_size=300, hidden_size=32,
                hybrid_override_pattern="M*-", num_attention_heads=2, num_key_value_heads=1,
                head_dim=16, mamba_num_heads=4, mamba_head_dim=8, n_groups=1, ssm_state_size=8,
                conv_kernel=4, intermediate_size=64, layer_norm_epsilon=1e-5)
    monkeypatch.setitem(synthetic.SYNTHETIC, "tiny", tiny)
    monkeypatch.setattr(cli, "SYNTHETIC", synthetic.SYNTHETIC)
    args = cli.parse_args(["--synthetic", "tiny", "--dtype", "float32", "--num-slots", "2",
                           "--max-len", "64"])
    state = cli.build_state(args)
    assert state.served.name == "tiny" and state.served.vocab == 300
    assert state.chat_template is None and state.served.eos_ids == ()
    out = state.worker.engine.generate([Request(prompt=[5, 299, 7], max_new_tokens=4)])[0]
    text = state.tokenizer.decode(out.tokens)
    assert text.split() == [f"<{t}>" for t in out.tokens]


def test_the_tool_call_format_follows_the_template_unless_named():
    hermes = "{% if tools %}<tool_call>{% endif %}{{ messages }}"
    plain = "{{ messages }}"
    assert [cli.tool_format("auto", t) for t in (hermes, plain, None)] == ["hermes", None, None]
    assert cli.tool_format("xml", plain) == "xml" and cli.tool_format("none", hermes) is None
