"""Text out of a token stream: incremental detokenization (characters come out whole) and stop
strings (the text is cut before the first one, and text that may still become one is held back).
"""

from __future__ import annotations

from collections.abc import Sequence

CONTEXT_TOKENS = 5      # prompt tokens decoded before the first new one (a leading space survives)
REPLACEMENT = "\ufffd"  # what a decoder makes of an incomplete UTF-8 sequence


class Detokenizer:
    """Turns one request's new tokens into text, token by token.

    Each step decodes a short window (the last emitted tokens plus the new ones) and emits what
    the new ones add, once it does not end in an incomplete character; so the pieces concatenate
    to the decoded output and a multi-byte character comes out in one piece. `tokenizer` is a
    `tokenizers.Tokenizer` (special tokens are skipped, as Hugging Face's decode does)."""

    def __init__(self, tokenizer, prompt: Sequence[int]):
        self.tok = tokenizer
        self.ids = [int(t) for t in prompt[-CONTEXT_TOKENS:]]
        self.prefix = 0                      # window start: context for the next piece
        self.read = len(self.ids)            # tokens before this index are emitted

    def push(self, *tokens: int) -> str:
        """The text that `tokens` complete ("" while a character is incomplete)."""
        self.ids += map(int, tokens)
        start, text = self._pending()
        if len(text) > start and not text.endswith(REPLACEMENT):
            self.prefix, self.read = self.read, len(self.ids)
            return text[start:]
        return ""

    def flush(self) -> str:
        """The rest at the end of the output (an incomplete character as U+FFFD)."""
        start, text = self._pending()
        self.prefix = self.read = len(self.ids)
        return text[start:]

    def _pending(self):
        """(where the new text starts, the window's text). A prompt that ends inside a
        character decodes with U+FFFD there; when the new tokens complete that character, it
        comes out with them (the text would skip it otherwise)."""
        decode = self.tok.decode
        done, text = decode(self.ids[self.prefix:self.read]), decode(self.ids[self.prefix:])
        start = len(done)
        while start and done[start - 1] == REPLACEMENT and (
                start > len(text) or text[start - 1] != REPLACEMENT):
            start -= 1
        return start, text


def tag_start(text: str, tag: str) -> int:
    """The length of text's longest tail that begins `tag` (shorter than it; 0: none): what a
    stream must hold back until it knows whether the tag follows."""
    return next((k for k in range(min(len(tag) - 1, len(text)), 0, -1)
                 if tag.startswith(text[-k:])), 0)


class StopStrings:
    """Cuts a text stream before the first of `stops` (non-empty strings) and holds back text that
    could still begin one, so nothing emitted ever shows a part of a stop string."""

    def __init__(self, stops: Sequence[str]):
        self.stops = tuple(stops)
        self.held = ""
        self.hit = False                     # a stop string was found: the stream is over

    def push(self, piece: str) -> str:
        """The part of held text + `piece` that is safe to emit ("" once a stop string hit)."""
        if self.hit or not self.stops:
            return "" if self.hit else piece
        text = self.held + piece
        cut = min((i for i in (text.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self.held, self.hit = "", True
            return text[:cut]
        keep = len(text) - max(tag_start(text, s) for s in self.stops)
        self.held = text[keep:]
        return text[:keep]

    def flush(self) -> str:
        """The held text at the end of the output (it never became a stop string)."""
        text, self.held = self.held, ""
        return text
