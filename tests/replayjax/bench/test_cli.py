"""`replayjax` dispatches the bench subcommands; each one's help names its real command."""

import pytest

from replayjax import cli


def test_cli_lists_subcommands(capsys):
    assert cli.main([]) == 0
    out = capsys.readouterr().out
    assert all(c in out for c in ("generate", "serve", "convert", "bench kernels",
                                  "bench verify", "bench serve", "profile"))
    assert cli.main(["nonsense"]) == 2


@pytest.mark.parametrize("argv,prog,default", [
    (["bench"], "replayjax bench", "(default: 32)"),
    (["bench", "kernels"], "replayjax bench kernels", "(default: 1 8 32 64 128 256 512)"),
    (["bench", "verify"], "replayjax bench verify", "(default: 2 4 8)"),
    (["bench", "serve"], "replayjax bench serve", "(default: 64)"),
    (["profile"], "replayjax profile", "(default: 16)"),
])
def test_help_names_the_command_shows_defaults_and_examples(argv, prog, default, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(argv + ["--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0 and out.startswith(f"usage: {prog} ")
    assert default in " ".join(out.split())
    examples = out.split("examples:\n")[1].splitlines()
    assert 2 <= len(examples) <= 3 and all(x.startswith(f"  {prog} ") for x in examples)
    assert "python -m" not in out
