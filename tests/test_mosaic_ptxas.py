"""scripts/mosaic_ptxas.py's pure parts (no CUDA, compiler or network): ptxas -v parsing, the
sm90 occupancy arithmetic, --sass's SASS parsing and loops, and --tune entries applied to (and
checked against) the measured tilings as `replayjax bench kernels` / `bench verify` do."""

import dataclasses
import importlib.util
from pathlib import Path

import pytest

_SPEC = importlib.util.spec_from_file_location(
    "mosaic_ptxas", Path(__file__).resolve().parents[1] / "scripts" / "mosaic_ptxas.py")
mp = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(mp)

# `ptxas -arch=sm_90a -v` on the GDN verify kernel's PTX (CUDA 13.0), bounds notes shortened
PTXAS_OUT = """\
ptxas /tmp/x/k.ptx, line 1646; info    : Potential out of bound access while accessing symbol \
'__dynamic_shmem__0' of type '.b8' with instruction type '.b32'.
ptxas warning : .loc directive without .file directive is found, line information in generated \
binary may not be complete
ptxas info    : (C7519) warpgroup.arrive is injected in around line 1162 by compiler to allow use \
of registers in GMMA in function 'gdn_replay_verify_mgpu_mosaic_gpu_kernel'
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'gdn_replay_verify_mgpu_mosaic_gpu_kernel' for 'sm_90a'
ptxas info    : Function properties for gdn_replay_verify_mgpu_mosaic_gpu_kernel
    0 bytes stack frame, 24 bytes spill stores, 16 bytes spill loads
ptxas info    : Used 153 registers, used 2 barriers, 1 bytes smem
ptxas info    : Compile time = 183.995 ms
"""


def test_ptxas_verbose_output_parses():
    assert mp.parse_ptxas(PTXAS_OUT) == {
        "kernel": "gdn_replay_verify_mgpu_mosaic_gpu_kernel", "registers": 153,
        "spill_stores": 24, "spill_loads": 16, "static_smem": 1}
    assert mp.parse_ptxas("ptxas info    : 0 bytes gmem\n") == {}


@pytest.mark.parametrize("regs,threads,smem,want", [
    (153, 128, 66744, (3, 3, 3)),      # 20 x 256 registers a warp; 228 KiB / (65.2 + 1) KiB
    (106, 128, 66744, (4, 3, 3)),      # 14 x 256 a warp: 4 by registers, SMEM-bound
    (222, 128, 82113, (2, 2, 2)),
    (87, 128, 44136, (5, 5, 5)),
    (32, 1024, 0, (2, 228, 2)),        # 32 warps a CTA: 2 by registers and by the 64 warps
    (16, 32, 0, (128, 228, 32)),       # at most 32 CTAs an SM
])
def test_sm90_occupancy(regs, threads, smem, want):
    assert mp.occupancy(regs, threads, smem) == want


def test_a_row_shows_the_kernel_and_its_occupancy():
    st = dict(mp.parse_ptxas(PTXAS_OUT), dynamic_smem=66743, threads=128)
    assert mp.row("| qwen3-next | 4 | {} |", st) == (
        "| qwen3-next | 4 | {} | gdn_replay_verify_mgpu | 153 | 24 / 16 | 65.2 | 128 | 3 | 3 | 3 |")
    assert mp.HEADER.splitlines()[0].count("|") == mp.row("|a|b|c|", st).count("|")


# `cuobjdump -sass` lines (encodings cut): a pipeline loop of 17 instructions whose barrier
# wait has its slow path after the EXIT, a spin loop of 5 there, and the final self-branch
SASS = """\
        /*0000*/                   LDC R1, c[0x0][0x28] ;
        /*0010*/                   S2R R0, SR_TID.X ;
        /*0020*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [R5+URZ], R4 ;
        /*0030*/              @!P0 BRA 0x200 ;
        /*0040*/                   LDS.128 R8, [R6+0xc00] ;
""" + "".join(f"        /*{0x50 + 16 * i:04x}*/                   FFMA R{i}, R8, R9, R{i} ;\n"
              for i in range(12)) + """\
        /*0110*/                   ISETP.NE.U32.AND P1, PT, R2, 0x4, PT ;
        /*0120*/               @P1 BRA 0x20 ;
        /*0130*/                   EXIT ;
        /*0200*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [R5+URZ], R4 ;
        /*0210*/              @!P0 NANOSLEEP.SYNCS 0x989680 ;
        /*0220*/              @!P0 SYNCS.PHASECHK.TRANS64 P0, [R5+URZ], R4 ;
        /*0230*/              @!P0 BRA 0x200 ;
        /*0240*/                   BRA 0x40 ;
        /*0250*/                   BRA 0x250;
"""


def test_sass_parses_and_finds_the_loops():
    instrs = mp.parse_sass(SASS)
    assert len(instrs) == 26
    assert instrs[3] == (0x30, "BRA", "0x200") and instrs[-1][:2] == (0x250, "BRA")
    # the pipeline loop only: the slow path's branch back and the spin loop come after EXIT
    (start, n, ops), = mp.sass_loops(instrs)
    assert (start, n, ops["FFMA"], ops["BRA"], ops["SYNCS"]) == (0x20, 17, 12, 2, 1)
    assert mp.sass_cells(SASS) == " 26 | 17 (12 FFMA) |"
    assert mp.sass_cells(SASS.replace("@P1 BRA 0x20", "@P1 BRA 0x130")) == " 26 | - |"


def test_a_sass_row_has_the_sass_header_cells():
    st = dict(mp.parse_ptxas(PTXAS_OUT), dynamic_smem=66743, threads=128, sass=SASS)
    assert (mp.HEADER + mp.SASS_HEADER).count("|") == mp.row("|a|b|c|", st).count("|")
    assert mp.row("|a|b|c|", st).endswith("| 3 | 26 | 17 (12 FFMA) |")


def _cases(*argv):
    from replayjax.bench.families import FAMILIES
    args = mp.parse_args(list(argv))
    return mp.cases(args, FAMILIES[args.family]())


def test_tune_entries_change_the_measured_tilings():
    from pallas_kernels import gdn, mamba2
    from pallas_kernels.validation import for_window
    rows = _cases("--family", "gdn", "--kernel", "verify", "--tokens", "4", "8", "--tune",
                  '[{}, {"prologue": "fused"}]')
    assert [(s, T, cfg) for s, T, cfg, _ in rows] == [
        ("qwen3-next", 4, {}), ("qwen3-next", 4, {"prologue": "fused"}),
        ("qwen3-next", 8, {}), ("qwen3-next", 8, {"prologue": "fused"})]
    assert [base for *_, base in rows] == [for_window(gdn.MOSAIC_VERIFY_TILINGS, T)
                                           for T in (4, 4, 8, 8)]
    (row,) = _cases("--family", "mamba2", "--kernel", "replay")
    assert row == ("nemotron-h-8b", 1, {}, mamba2.MOSAIC_REPLAY_TILING)
    (row,) = _cases("--family", "gdn", "--kernel", "standard", "--tune", '[{"block_k": 32}]')
    assert dataclasses.replace(row[3], **row[2]) == gdn.GDNMosaicTiling(block_k=32)


@pytest.mark.parametrize("tune,error", [
    ('[{"bogus": 1}]', "--tune: unknown tiling field(s) ['bogus'] (fields of GDNMosaicTiling: "),
    ('[{}, {"num_stages": 0}]', "--tune: field 'num_stages' must be an integer >= 1, got 0"),
    ('[{"prologue": 3}]', "--tune: field 'prologue' must be a str, got 3"),
])
def test_a_bad_tune_field_is_one_line_before_any_work(tune, error, capsys, monkeypatch):
    monkeypatch.setattr(mp, "tools", lambda: pytest.fail("checked after the tools"))
    assert mp.main(["--family", "gdn", "--kernel", "verify", "--tune", tune]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(f"scripts/mosaic_ptxas.py: error: {error}")
    assert err.count("\n") == 1


@pytest.mark.parametrize("argv,error", [
    (["--tune", "{}"], "argument --tune: must be a JSON list of objects, got '{}'"),
    (["--tune", "[]"], "argument --tune: must be a non-empty JSON list of objects"),
    (["--tune", "[{"], "argument --tune: not valid JSON"),
    (["--tokens", "32"], "argument --tokens: must be in [1, "),
])
def test_bad_flags_are_one_line(argv, error, capsys):
    with pytest.raises(SystemExit) as e:
        mp.parse_args(["--family", "gdn", "--kernel", "verify", *argv])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith(f"scripts/mosaic_ptxas.py: error: {error}")
    assert err.count("\n") == 1
