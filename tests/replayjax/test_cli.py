"""`replayjax` dispatches its subcommands; every command's help names the real command, shows
every default, explains what each option does and ends with examples; --version everywhere;
progress only for a person watching a terminal."""

import importlib
import io

import pytest

from replayjax import cli, commandline

COMMANDS = sorted(cli.COMMANDS)


def test_cli_lists_subcommands(capsys):
    assert cli.main([]) == 0
    out = capsys.readouterr().out
    assert all(c in out for c in cli.COMMANDS) and "--version" in out
    assert cli.main(["nonsense"]) == 2
    assert cli.main(["bench", "kernelz"]) == 2
    assert "did you mean 'bench kernels'?" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--version"]] + [c.split() + ["--version"] for c in COMMANDS])
def test_version(argv, capsys):
    try:
        code = cli.main(argv)
    except SystemExit as e:
        code = e.code
    from replayjax import __version__
    assert code == 0 and capsys.readouterr().out.startswith(f"replayjax {__version__} (jax ")


@pytest.mark.parametrize("name", COMMANDS)
def test_help_names_the_command_shows_defaults_and_examples(name, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(name.split() + ["--help"])
    out = capsys.readouterr().out
    prog = f"replayjax {name}"
    assert e.value.code == 0 and out.startswith(f"usage: {prog} ")
    examples = out.split("examples:\n")[1].splitlines()
    assert 2 <= len(examples) <= 3 and all(x.startswith(f"  {prog} ") for x in examples)
    assert "python -m" not in out
    parser = importlib.import_module(cli.COMMANDS[name][0]).build_parser()
    for action in parser._actions:
        if action.help == "==SUPPRESS==" or not action.option_strings or action.nargs == 0:
            continue
        text = commandline._Formatter(prog)._get_help_string(action)
        assert text, f"{prog} {action.option_strings[0]} has no help"
        if action.default not in (None, []):       # absent means nothing: help says so
            assert "default" in text, f"{prog} {action.option_strings[0]}: default not shown"


def test_generate_help_says_what_greedy_and_the_seed_are(capsys):
    with pytest.raises(SystemExit):
        cli.main(["generate", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--temperature T 0 = greedy" in out and "(default: 0.0)" in out
    assert "same seed gives the same output with the same --speculative and --num-draft "\
           "(default: 0)" in out
    assert "--top-p P" in out and "1 = off (default: 1.0)" in out


def test_limits_repeated_for_parsing_match_the_kernels():
    from pallas_kernels import ring
    from replayjax import requests
    assert (commandline.MAX_WINDOW, commandline.MAX_VERIFY_TOKENS) == (ring.MAX_WINDOW,
                                                                     ring.MAX_VERIFY_TOKENS)
    assert commandline.MAX_TOP_LOGPROBS == requests.MAX_TOP_LOGPROBS


def test_progress_is_drawn_only_when_enabled(monkeypatch, capsys):
    with commandline.Progress(2, enabled=False) as p, p.stage("loading the model"):
        p.note("3/4 tokens")
    assert capsys.readouterr().err == ""
    with commandline.Progress(2, enabled=True) as p, p.stage("loading the model"):
        p.note("3/4 tokens")
    err = capsys.readouterr().err
    assert "loading the model" in err and "3/4 tokens" in err


@pytest.mark.parametrize("json_flag,tty,shown", [
    ({}, True, True), ({"json": True}, True, False), ({"jsonl": True}, True, False),
    ({}, False, False)])
def test_progress_is_for_a_terminal_only(json_flag, tty, shown, monkeypatch):
    class Args:
        json = jsonl = False
    args = Args()
    for k, v in json_flag.items():
        setattr(args, k, v)
    stderr = io.StringIO()
    stderr.isatty = lambda: tty
    monkeypatch.setattr("sys.stderr", stderr)
    assert commandline.interactive(args) is shown
