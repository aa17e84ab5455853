"""A model directory's generation settings (`replayjax.server.model_files`): the defaults a
request's omitted sampling fields take, and one-line errors naming the file and the field."""

from __future__ import annotations

import json

import pytest

from replayjax.sampling import SamplingParams
from replayjax.server.model_files import ModelFilesError, generation_settings


def _dir(tmp_path, gen):
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": 2}))
    (tmp_path / "generation_config.json").write_text(json.dumps(gen))
    return str(tmp_path)


@pytest.mark.parametrize("gen, want", [
    ({}, SamplingParams(temperature=1.0)),
    ({"do_sample": False, "temperature": 0.6}, SamplingParams()),
    ({"temperature": 0.6, "top_k": 20, "top_p": 0.95}, SamplingParams(0.6, 20, 0.95)),
    ({"temperature": None, "top_k": 20.0}, SamplingParams(1.0, 20)),     # null: not given
])
def test_defaults(tmp_path, gen, want):
    assert generation_settings(_dir(tmp_path, {"eos_token_id": [2, 3], **gen})) == ((2, 3), want)


@pytest.mark.parametrize("gen, match", [
    ({"temperature": "hot"}, r"temperature must be a finite number >= 0 .*, got 'hot'"),
    ({"top_k": 3_000_000_000}, r"top_k must be an integer in \[0, 2\^31\) .*, got 3000000000"),
    ({"top_k": 2.5}, r"top_k must be an integer in .*, got 2.5"),
    ({"top_p": 0}, r"top_p must be a number in \(0, 1\] .*, got 0"),
])
def test_bad_settings_are_named(tmp_path, gen, match):
    with pytest.raises(ModelFilesError, match=r"generation_config.json: " + match):
        generation_settings(_dir(tmp_path, gen))
