"""Text prompts through `replayjax generate`: a tiny word-level tokenizer.json (built with the
`tokenizers` library, ids < the fixture's vocab of 128) beside a copy of a fixture model."""

import json
import shutil

from replayjax import generate_cli

FIXTURE = "tests/fixtures/hf/nemotron_h"
WORDS = "the a cat dog sat on mat and ran far away big small red blue green".split()


def word_tokenizer(vocab_size=128):
    """Word-level tokenizer over WORDS plus filler words w0, w1, ... to exactly `vocab_size` ids,
    so every id the model can emit decodes to a word."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    words = ["<pad>", "<s>", "</s>", "[UNK]"] + WORDS
    words += [f"w{i}" for i in range(vocab_size - len(words))]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return tok


def model_dir_with_tokenizer(tmp_path, src=FIXTURE):
    """A copy of fixture model `src` with a tokenizer.json; returns (dir, tokenizer)."""
    d = tmp_path / "model"
    shutil.copytree(src, d)
    tok = word_tokenizer()
    tok.save(str(d / "tokenizer.json"))
    return str(d), tok


def test_text_prompt_is_encoded_and_output_decoded(tmp_path, capsys):
    d, tok = model_dir_with_tokenizer(tmp_path)
    prompt = "the big cat sat on the red mat"
    generate_cli.main(["--model", d, "--prompt", prompt, "--max-new-tokens", "4",
                       "--window", "4", "--max-len", "64", "--json"])
    row = json.loads(capsys.readouterr().out)["results"][0]
    ids = tok.encode(prompt).ids
    assert 3 not in ids and max(ids) < 128       # every word known, all ids in the model's vocab
    assert row["prompt_ids"] == ids
    assert len(row["tokens"]) == 4
    assert row["text"] == tok.decode(row["tokens"]) and row["text"]


def test_text_prompt_without_tokenizer_json_is_a_clear_error(tmp_path, capsys):
    d = tmp_path / "model"
    shutil.copytree(FIXTURE, d)
    assert generate_cli.main(["--model", str(d), "--prompt", "the cat"]) == 1
    err = capsys.readouterr().err
    assert "tokenizer.json" in err and "--prompt-ids" in err
