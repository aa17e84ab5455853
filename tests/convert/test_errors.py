"""Every refusal is one clear line on stderr, a non-zero exit status from `replayjax.cli.main`,
and leaves nothing behind: no OUT_DIR and no temporary directory next to it."""

import errno
import json
import os
import re
import shutil
import signal
import struct

import numpy as np
import pytest

import convert.converter as converter
import convert.writer as writer
from convert import ConvertError, load_hf
from convert.safetensors_io import Reader, open_checkpoint
from replayjax import cli
from replayjax.loading import load_model
from tests.convert.helpers import fixture_dir, make_checkpoint, tensors_of

V = "nemotron_h"


@pytest.fixture
def dst(tmp_path):
    d = tmp_path / "dst"
    d.mkdir()
    return d


def refuse(capsys, dst, src, *extra, code=1):
    """Run the CLI, expect `code`, nothing under dst; return the error line."""
    out = dst / "out"
    assert cli.main(["convert", str(src), str(out), *extra]) == code
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("replayjax convert: error: "), err
    assert os.listdir(dst) == [], os.listdir(dst)
    return lines[0]


def test_missing_config(tmp_path, dst, capsys):
    src = make_checkpoint(tmp_path / "hf", V)
    os.remove(os.path.join(src, "config.json"))
    assert "no config.json in" in refuse(capsys, dst, src)


def test_input_not_a_directory(tmp_path, dst, capsys):
    assert "is not a directory" in refuse(capsys, dst, tmp_path / "nope")


def test_unknown_model_type(tmp_path, dst, capsys):
    cfg = json.load(open(os.path.join(fixture_dir(V), "config.json")))
    src = make_checkpoint(tmp_path / "hf", V, config=dict(cfg, model_type="llama"))
    assert "unsupported model_type 'llama'" in refuse(capsys, dst, src)


def test_no_safetensors(tmp_path, dst, capsys):
    src = make_checkpoint(tmp_path / "hf", V)
    os.remove(os.path.join(src, "model.safetensors"))
    assert "no model.safetensors or model.safetensors.index.json" in refuse(capsys, dst, src)


def _file(src):
    return os.path.join(src, "model.safetensors")


def test_truncated_safetensors(tmp_path, dst, capsys):
    src = make_checkpoint(tmp_path / "hf", V)
    size = os.path.getsize(_file(src))
    with open(_file(src), "r+b") as f:
        f.truncate(size - 1000)
    msg = refuse(capsys, dst, src)
    assert f"model.safetensors ({size - 1000} bytes): truncated or corrupt: the tensors" in msg


def test_truncated_inside_header(tmp_path, dst, capsys):
    src = make_checkpoint(tmp_path / "hf", V)
    with open(_file(src), "r+b") as f:
        f.truncate(100)
    assert ("model.safetensors (100 bytes): truncated or corrupt: the header length does not fit"
            in refuse(capsys, dst, src))


def test_header_not_json(tmp_path, dst, capsys):
    src = make_checkpoint(tmp_path / "hf", V)
    with open(_file(src), "r+b") as f:
        f.seek(8)
        f.write(b"\xff{garbage")
    msg = refuse(capsys, dst, src)
    assert "model.safetensors (" in msg and "corrupt safetensors header: invalid UTF-8" in msg


def _rewrite_header(path, edit):
    """Replace the header of a safetensors file by edit(header dict), keeping the data."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    blob = json.dumps(edit(header)).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)) + blob + data)


def test_offsets_past_the_end(tmp_path, dst, capsys):
    src = make_checkpoint(tmp_path / "hf", V)

    def edit(h):
        meta = h["lm_head.weight"]
        b, e = meta["data_offsets"]
        meta["data_offsets"] = [b + 10 ** 6, e + 10 ** 6]
        return h

    _rewrite_header(_file(src), edit)
    msg = refuse(capsys, dst, src)
    assert "model.safetensors (" in msg and "invalid offset for tensor `lm_head.weight`" in msg


def test_offsets_inconsistent_with_shape(tmp_path, dst, capsys):
    src = make_checkpoint(tmp_path / "hf", V)

    def edit(h):
        h["backbone.norm_f.weight"]["shape"] = [33]
        return h

    _rewrite_header(_file(src), edit)
    msg = refuse(capsys, dst, src)
    assert "model.safetensors (" in msg
    assert "corrupt safetensors header: invalid shape, data type, or offset for tensor" in msg


def test_overlapping_tensors(tmp_path, dst, capsys):
    src = make_checkpoint(tmp_path / "hf", V)

    def edit(h):
        offsets = h["backbone.layers.0.norm.weight"]["data_offsets"]
        h["backbone.norm_f.weight"]["data_offsets"] = offsets
        return h

    _rewrite_header(_file(src), edit)
    msg = refuse(capsys, dst, src)      # the library names either of the two
    assert re.search(r"invalid offset for tensor `backbone\.(layers\.0\.norm|norm_f)\.weight`", msg)


def test_index_names_missing_shard(tmp_path, dst, capsys):
    src = make_checkpoint(tmp_path / "hf", V, shards=2)
    os.remove(os.path.join(src, "model-00002-of-00002.safetensors"))
    assert "shard model-00002-of-00002.safetensors listed in" in refuse(capsys, dst, src)


def test_shape_mismatch(tmp_path, dst, capsys):
    t = tensors_of(V)
    t["backbone.layers.0.mixer.A_log"] = np.zeros(5, np.float32)
    src = make_checkpoint(tmp_path / "hf", V, t)
    msg = refuse(capsys, dst, src)
    assert ("shape mismatch for backbone.layers.0.mixer.A_log: expected [4] from config.json, "
            "found [5] in model.safetensors") in msg


def test_missing_tensor(tmp_path, dst, capsys):
    t = tensors_of(V)
    del t["lm_head.weight"], t["backbone.layers.5.mixer.experts.3.down_proj.weight"]
    src = make_checkpoint(tmp_path / "hf", V, t)
    msg = refuse(capsys, dst, src)
    assert ("missing 2 tensor(s) that the config requires: "
            "backbone.layers.5.mixer.experts.3.down_proj.weight, lm_head.weight") in msg


def test_unused_tensor(tmp_path, dst, capsys):
    t = tensors_of(V)
    t["backbone.layers.0.mixer.extra.weight"] = np.zeros(3, np.float32)
    src = make_checkpoint(tmp_path / "hf", V, t)
    msg = refuse(capsys, dst, src)
    assert "1 unused tensor(s) that a nemotron_h model with this config does not have: " \
           "backbone.layers.0.mixer.extra.weight" in msg


def test_non_float_tensor(tmp_path, dst, capsys):
    t = tensors_of(V)
    t["backbone.norm_f.weight"] = np.zeros(32, np.int32)
    src = make_checkpoint(tmp_path / "hf", V, t)
    assert "tensor backbone.norm_f.weight has dtype I32" in refuse(capsys, dst, src)


def test_unwritable_output(tmp_path, dst, capsys, monkeypatch):
    src = make_checkpoint(tmp_path / "hf", V)

    def denied(*a, **k):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(converter.tempfile, "mkdtemp", denied)
    msg = refuse(capsys, dst, src)
    assert "cannot write" in msg and "Permission denied" in msg


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_unwritable_output_real(tmp_path, dst, capsys):
    src = make_checkpoint(tmp_path / "hf", V)
    os.chmod(dst, 0o555)
    try:
        assert "cannot write" in refuse(capsys, dst, src)
    finally:
        os.chmod(dst, 0o755)


def test_output_parent_missing(tmp_path, dst, capsys):
    src = make_checkpoint(tmp_path / "hf", V)
    assert cli.main(["convert", src, str(dst / "a" / "b")]) == 1
    assert "parent directory" in capsys.readouterr().err and os.listdir(dst) == []


def test_disk_full_during_write(tmp_path, dst, capsys, monkeypatch):
    src = make_checkpoint(tmp_path / "hf", V)
    calls = []
    real = writer._write_block

    def full(store, index, block):
        calls.append(index)
        if len(calls) == 10:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(store, index, block)

    monkeypatch.setattr(writer, "_write_block", full)
    msg = refuse(capsys, dst, src)
    assert "disk full while writing" in msg and str(dst / "out") in msg
    assert len(calls) == 10


def test_not_enough_disk_space(tmp_path, dst, capsys, monkeypatch):
    src = make_checkpoint(tmp_path / "hf", V)
    monkeypatch.setattr(converter.shutil, "disk_usage",
                        lambda p: shutil._ntuple_diskusage(10 ** 9, 10 ** 9, 1000))
    assert "not enough disk space" in refuse(capsys, dst, src)


def test_output_inside_input_refused(tmp_path, capsys):
    src = make_checkpoint(tmp_path / "hf", V)
    assert cli.main(["convert", src, src, "--overwrite"]) == 1
    assert "would replace the input directory" in capsys.readouterr().err
    assert os.path.exists(os.path.join(src, "model.safetensors"))


def test_interrupt_signal_mid_write_leaves_nothing(tmp_path, dst, monkeypatch):
    """A real SIGINT while the writer thread is busy: the main thread gets KeyboardInterrupt,
    the writer stops at its next block, the temp dir is removed, OUT_DIR never appears."""
    src = make_checkpoint(tmp_path / "hf", V)
    calls = []
    real = writer._write_block

    def interrupt(store, index, block):
        calls.append(index)
        if len(calls) == 5:
            os.kill(os.getpid(), signal.SIGINT)
        return real(store, index, block)

    monkeypatch.setattr(writer, "_write_block", interrupt)
    with pytest.raises(KeyboardInterrupt):
        converter.convert(src, dst / "out", block_bytes=256)
    assert os.listdir(dst) == []
    assert 5 <= len(calls) < 200       # stopped early (the full conversion writes > 1000 blocks)


def test_interrupt_before_rename_cli_exit_130(tmp_path, dst, capsys, monkeypatch):
    src = make_checkpoint(tmp_path / "hf", V)

    def interrupted(*a):
        raise KeyboardInterrupt()

    monkeypatch.setattr(converter, "_move_into_place", interrupted)
    assert "interrupted" in refuse(capsys, dst, src, code=130)


def test_api_raises_convert_error(tmp_path, dst):
    with pytest.raises(ConvertError, match="is not a directory"):
        converter.convert(tmp_path / "nope", dst / "out")
    with pytest.raises(ConvertError, match="^dtype must be one of bfloat16, float32, got "
                                           "'float16'$"):
        converter.convert(fixture_dir(V), dst / "out", dtype="float16")
    assert os.listdir(dst) == []


@pytest.mark.parametrize("dtype", ["int8", np.int32, "float16", np.float64, "bf16", 5])
def test_loaders_refuse_dtypes_a_model_cannot_run(tmp_path, dtype):
    """Integer dtypes would truncate the weights, float16 / float64 do not run: every loader
    refuses them in one line; dtype objects of the two model dtypes are accepted."""
    for load_fn in (load_hf, load_model):
        with pytest.raises(ConvertError, match="dtype must be one of bfloat16, float32, got"):
            load_fn(fixture_dir(V), dtype=dtype)


@pytest.mark.parametrize("kw,match", [
    (dict(mesh="x"), "mesh must be a jax.sharding.Mesh .* got a str"),
    (dict(partition=5), "partition must be a models.sharding.TPRules or a function"),
    (dict(experts="bogus"), "experts must be one of 'width', 'experts', got 'bogus'"),
])
def test_loaders_refuse_bad_placement_arguments(kw, match):
    with pytest.raises(ConvertError, match=match):
        load_hf(fixture_dir(V), **kw)


def test_bad_arguments_exit_2(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["convert", "only-one-arg"])
    assert e.value.code == 2
    with pytest.raises(SystemExit) as e:
        cli.main(["convert", "a", "b", "--dtype", "float16"])
    assert e.value.code == 2


def test_file_shrinking_while_it_is_read(tmp_path):
    """A shard cut short after its header was validated (a download still being written): the
    block read fails with one line, where a memory-mapped read would kill the process (SIGBUS)."""
    src = make_checkpoint(tmp_path / "hf", V)
    info = open_checkpoint(src).tensors["lm_head.weight"]
    _truncate_to(_file(src), info.start + 4)
    reader = Reader()
    try:
        with pytest.raises(ConvertError, match="model.safetensors: truncated file: tensor "
                                               "lm_head.weight could not be read to its end"):
            reader.read(info)
    finally:
        reader.close()


def _truncate_to(path, size):
    with open(path, "r+b") as f:
        f.truncate(size)
