"""A reasoning model's thinking apart from its answer: chat replies split at </think> into
`reasoning_content` and `content`, as DeepSeek's API and vLLM's reasoning parsers return them.

Models whose chat templates think in <think>...</think> (Qwen3, Qwen3.5, Qwen3-Next Thinking,
Nemotron-H reasoning, Nemotron 3) either get <think> in the prompt from the template's
generation prompt (their reply is thinking up to </think>) or write <think> themselves at the
start of the reply. `open_after(prompt)` tells the first case from the prompt's text (its last
<think> not closed); a reply that starts with <think> (after whitespace) is the second. A reply
in neither case is all content (e.g. Qwen3.5 with enable_thinking false: the template closes
an empty think block in the prompt). A reply cut before </think> is all thinking. The blank
lines templates put around the tags are dropped. With tools, a tool call's start tag ends the
thinking too (Qwen3.5 may open a call without closing its think block first); the answer
begins with the tag.
"""

from __future__ import annotations

from replayjax.server.text import tag_start

OPEN, CLOSE = "<think>", "</think>"


def template_thinks(source: str | None) -> bool:
    """Whether a chat template's source uses think blocks."""
    return bool(source) and CLOSE in source


def open_after(prompt: str) -> bool:
    """Whether the reply to this prompt text starts inside a think block."""
    return prompt.rfind(OPEN) > prompt.rfind(CLOSE)


class ReasoningStream:
    """A reply's text as it streams, split into (reasoning, content) pieces; `thinking`: the
    prompt left it inside a think block (`open_after`). Text that may turn out to be a tag, or
    the newlines before </think>, waits for the next piece; the pieces join to the whole
    reply's split (`split_reasoning`). `call`: a tool call's start tag, which ends the thinking
    (kept in the answer), or None."""

    def __init__(self, thinking: bool, call: str | None = None):
        self.state = "think" if thinking else "start"   # "start": it may still open one
        self.thought = thinking                         # it thinks at all
        self.ends = (CLOSE,) + ((call,) if call else ())
        self.held = ""
        self.begun = {"think": False, "answer": False}  # a part's first character sent

    def push(self, piece: str) -> tuple[str, str]:
        text, self.held = self.held + piece, ""
        if self.state == "start":
            lead = text.lstrip()
            if lead.startswith(OPEN):
                self.state, self.thought, text = "think", True, lead[len(OPEN):]
            elif OPEN.startswith(lead):         # only whitespace, or a part of <think>, so far
                self.held = text
                return "", ""
            else:
                self.state = "answer"
                return "", text
        if self.state == "answer":
            return "", self._part("answer", text)
        found = [(i, tag) for tag in self.ends if (i := text.find(tag)) >= 0]
        if found:
            i, tag = min(found)
            self.state = "answer"
            rest = text[i + len(CLOSE):] if tag == CLOSE else text[i:]
            return self._part("think", text[:i].rstrip("\n")), self._part("answer", rest)
        body = text[:len(text) - max(tag_start(text, tag) for tag in self.ends)]
        body = body.rstrip("\n")                # newlines right before </think> are layout
        self.held = text[len(body):]
        return self._part("think", body), ""

    def _part(self, part: str, text: str) -> str:
        """text, without the newlines that open a part after a think block (layout)."""
        if self.thought and not self.begun[part]:
            text = text.lstrip("\n")
            self.begun[part] = bool(text)
        return text

    def finish(self) -> tuple[str, str]:
        """What was held back, once the reply is whole (a think block never closed: all of it
        is thinking)."""
        text, self.held = self.held, ""
        if self.state == "think":
            return self._part("think", text.rstrip("\n")), ""
        return "", text


def split_reasoning(text: str, thinking: bool, call: str | None = None
                    ) -> tuple[str | None, str]:
    """(reasoning_content, content) of a whole reply; reasoning None when it does not think
    (or thinks nothing). `call`: as `ReasoningStream`'s."""
    stream = ReasoningStream(thinking, call)
    parts = [stream.push(text), stream.finish()]
    return "".join(p[0] for p in parts) or None, "".join(p[1] for p in parts)
