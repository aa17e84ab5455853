"""The benchmark's byte model reproduces the minimum bytes the issues quote (per sequence,
layer and step at fp32 state, bf16 activations and ring, L = 16)."""

import pytest

from replayjax import kernel_bench


@pytest.mark.parametrize("family,shape,std_mb,rep_mb", [
    ("mamba2", "nemotron-h-8b", 8.43, 4.65),
    ("gdn", "qwen3-next", 4.22, 2.36),
])
def test_min_bytes_match_published_anchors(family, shape, std_mb, rep_mb):
    fam = kernel_bench.FAMILIES[family]()
    std, rep = fam.min_bytes(fam.shapes[shape], 16, 2)
    assert round(std / 1e6, 2) == std_mb and round(rep / 1e6, 2) == rep_mb
    assert std / rep == pytest.approx(std_mb / rep_mb, rel=5e-3)


def test_cli_lists_subcommands(capsys):
    from replayjax import cli
    assert cli.main([]) == 0
    out = capsys.readouterr().out
    assert "bench kernels" in out and "generate" in out
