"""Incremental detokenization and stop strings (replayjax.server.text), with the demo model's
byte-level tokenizer (token id == UTF-8 byte)."""

import os

import pytest
from tokenizers import Tokenizer

from replayjax.demo import model_dir
from replayjax.server.text import Detokenizer, StopStrings

TEXT = "Grüße, naïve café ✓ 日本語 🙂 end"


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.from_file(os.path.join(model_dir(), "tokenizer.json"))


def test_multibyte_characters_come_out_whole(tok):
    d = Detokenizer(tok, list(b"Prompt: "))
    pieces = [d.push(t) for t in TEXT.encode()] + [d.flush()]
    assert "".join(pieces) == TEXT
    assert "\ufffd" not in "".join(pieces)
    # one piece per character: the bytes of a character before its last give ""
    assert [p for p in pieces if p] == list(TEXT)


def test_an_incomplete_character_at_the_end_is_flushed_as_a_replacement(tok):
    d = Detokenizer(tok, [65])
    assert d.push(ord("a")) == "a"
    assert d.push(0xE2) == "" and d.push(0x9C) == ""          # 2 of the 3 bytes of ✓
    assert d.flush() == "\ufffd"


def test_a_prompt_ending_inside_a_character_loses_nothing(tok):
    """Token ids that end inside a character (here after 2 of the 3 bytes of ’): the completion's
    first piece is that character, completed, then the rest; a prompt's incomplete bytes the
    completion does not complete stay a U+FFFD of the prompt's."""
    ids = list("it’s ok".encode())
    d = Detokenizer(tok, ids[:4])
    assert "".join([d.push(t) for t in ids[4:]] + [d.flush()]) == "’s ok"
    d = Detokenizer(tok, ids[:4])
    assert "".join([d.push(t) for t in b"ab"] + [d.flush()]) == "ab"


def stream(stops, pieces):
    s = StopStrings(stops)
    out = [s.push(p) for p in pieces]
    return out, s


def test_stop_string_cuts_the_text_and_is_never_shown_in_part():
    text = "the licence END of it"
    out, s = stream(["END"], list(text))
    assert s.hit and "".join(out) == "the licence "
    # "E" and "EN" were held back, not emitted then taken back
    assert all(p in "the licence " for p in out)
    assert not any("E" in p for p in out)


def test_held_text_that_never_becomes_a_stop_string_is_released():
    out, s = stream(["ENDING"], ["an EN", "D", " x"])
    assert not s.hit
    assert out == ["an ", "", "END x"]
    out, s = stream(["ENDING"], ["an EN", "DI"])
    assert "".join(out) + s.flush() == "an ENDI"


def test_the_first_of_several_stop_strings_wins():
    out, s = stream(["c", "ab"], ["xabc"])
    assert s.hit and out == ["x"]
    out, s = stream(["bcd", "cd"], ["abc", "d"])       # "bcd" starts first
    assert s.hit and "".join(out) == "a"


def test_no_stop_strings_pass_everything():
    out, s = stream([], ["a", "b"])
    assert out == ["a", "b"] and not s.hit and s.flush() == ""


def test_several_tokens_at_once_give_the_same_text(tok):
    ids = list(TEXT.encode())
    d = Detokenizer(tok, [])
    pieces = [d.push(*ids[i:i + 3]) for i in range(0, len(ids), 3)] + [d.flush()]
    assert "".join(pieces) == TEXT and "\ufffd" not in "".join(pieces)
