"""Tool calls (OpenAI's `tools`) in chat: a request's tools checked, the tool-call format a
chat template teaches its model, and a reply's text split into content and `tool_calls`.

A model calls tools by writing blocks in the format its chat template describes:
  * "hermes": <tool_call>{"name": ..., "arguments": {...}}</tool_call>, one call a block
    (Qwen3, Qwen3-Next);
  * "xml": <tool_call><function=NAME><parameter=P>VALUE</parameter>...</function></tool_call>
    (Qwen3.5, Nemotron 3); a value is text, typed by the tool's JSON schema for P (a string
    parameter stays text; numbers, booleans, objects and arrays are read as JSON when they
    parse);
  * "toolcall": <TOOLCALL>[{"name": ..., "arguments": {...}}, ...]</TOOLCALL> (Nemotron-H,
    Nemotron-Nano-v2).
`template_format` reads it off the template's source (None: the template never renders
`tools`). Whitespace between the tags is the template's layout and is dropped. A reply whose
blocks do not all parse is plain content, as if it had called nothing. Each call gets an id
"call_<24 hex digits>"; its arguments are a JSON string, as OpenAI sends them.

tool_choice "required", or a function named ({"type": "function", "function": {"name": F}}),
forces a call by the prompt, not by a grammar: the reply is made to begin with a block's
opening (for F, up to its arguments; a think block the prompt opened is closed first), the
model writes the rest. A reply that then does not parse still comes back as content.
"""

from __future__ import annotations

import dataclasses
import json
import re
import uuid

from replayjax.server.text import tag_start

FORMATS = ("hermes", "xml", "toolcall")
_TAGS = {"hermes": ("<tool_call>", "</tool_call>"), "xml": ("<tool_call>", "</tool_call>"),
         "toolcall": ("<TOOLCALL>", "</TOOLCALL>")}
_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}")         # OpenAI's function names (and dots)
_FUNCTION = re.compile(r"<function=([^>\n]+)>(.*?)</function>", re.S)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.S)
_TOOL_KEYS, _FUNCTION_KEYS = {"type", "function"}, {"name", "description", "parameters",
                                                     "strict"}


class ToolError(ValueError):
    """A request's tools or tool-call history that this server cannot use: (message, param)."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


def template_format(source: str | None) -> str | None:
    """The tool-call format a chat template's source describes, or None when it renders no
    tools (no template, or one that never reads `tools`)."""
    if not source or "tools" not in source:
        return None
    if "<function=" in source:
        return "xml"
    if "<TOOLCALL>" in source:
        return "toolcall"
    if "<tool_call>" in source:
        return "hermes"
    return None


@dataclasses.dataclass(frozen=True)
class Tools:
    """A request's tools as its chat template gets them (`specs`: OpenAI's tool objects), the
    format the reply is read in, whether it may call more than one (parallel_tool_calls), and
    the text its reply is forced to begin with ("": none; tool_choice "required" or named)."""
    specs: tuple
    format: str
    parallel: bool = True
    forced: str = ""

    def schema(self, name: str) -> dict:
        """The JSON schema of function `name`'s parameters ({} if unknown)."""
        for spec in self.specs:
            if spec["function"]["name"] == name:
                params = spec["function"].get("parameters")
                return params if isinstance(params, dict) else {}
        return {}


def _opener(fmt: str, name: str | None) -> str:
    """The start of a call block in format fmt: up to the function's arguments when named."""
    start = _TAGS[fmt][0] + ("[" if fmt == "toolcall" else "\n")
    if name is None:
        return start
    if fmt == "xml":
        return f"{start}<function={name}>\n"
    return start + '{"name": ' + json.dumps(name) + ', "arguments": '


def _chosen(tool_choice, names) -> str | None | bool:
    """tool_choice as the function it forces (a name), True ("required": any), False ("auto")
    or None ("none"). ToolError for another value."""
    if tool_choice in (None, "auto"):
        return False
    if tool_choice == "none":
        return None
    if tool_choice == "required":
        return True
    fn = tool_choice.get("function") if isinstance(tool_choice, dict) else None
    if not (isinstance(fn, dict) and tool_choice.get("type") == "function"
            and isinstance(fn.get("name"), str)):
        raise ToolError("Invalid value for 'tool_choice': expected \"none\", \"auto\", "
                        "\"required\" or {\"type\": \"function\", \"function\": "
                        "{\"name\": ...}}.", "tool_choice")
    name = fn["name"]
    if name not in names:
        raise ToolError(f"'tool_choice' names the function '{name}', which is not among the "
                        f"request's tools.", "tool_choice")
    return name


def check_tools(tools, tool_choice, parallel: bool, fmt: str | None) -> Tools | None:
    """The request's Tools, or None when it gives none or tool_choice is "none" (the template
    then renders no tools and the reply is plain content). ToolError for malformed tools or
    tool_choice, or tools a template without a tool-call format cannot render."""
    if tools is not None and not isinstance(tools, list):
        raise ToolError(f"Invalid value for 'tools': expected a list of tools, got "
                        f"{type(tools).__name__}.", "tools")
    if not tools:
        if _chosen(tool_choice, ()) not in (False, None):   # (a named one fails in _chosen)
            raise ToolError("tool_choice \"required\" needs 'tools'.", "tool_choice")
        return None
    names = set()
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not (isinstance(tool, dict) and tool.get("type") == "function"
                and isinstance(tool.get("function"), dict)):
            raise ToolError(f"Invalid value for '{where}': expected {{\"type\": \"function\", "
                            f"\"function\": {{\"name\": ...}}}} (only function tools are "
                            f"supported).", where)
        fn = tool["function"]
        for at, keys, known in ((where, tool, _TOOL_KEYS),
                                (f"{where}.function", fn, _FUNCTION_KEYS)):
            if unknown := sorted(set(keys) - known):
                raise ToolError(f"Unrecognized field in '{at}': {unknown[0]}", at)
        name = fn.get("name")
        if not (isinstance(name, str) and _NAME.fullmatch(name)):
            raise ToolError(f"Invalid value for '{where}.function.name': expected 1-64 "
                            f"letters, digits, '_', '-' or '.', got {name!r}.",
                            f"{where}.function.name")
        if name in names:
            raise ToolError(f"'{where}.function.name': the function '{name}' is given twice.",
                            f"{where}.function.name")
        names.add(name)
        for key, kind, want in (("description", str, "a string"),
                                ("parameters", dict, "a JSON schema object"),
                                ("strict", bool, "a boolean")):
            if fn.get(key) is not None and not isinstance(fn[key], kind):
                raise ToolError(f"Invalid value for '{where}.function.{key}': expected {want}.",
                                f"{where}.function.{key}")
    choice = _chosen(tool_choice, names)
    if choice is None:
        return None
    if fmt is None:
        raise ToolError("This model's chat template describes no tool-call format (it never "
                        "renders 'tools'); start the server with --chat-template FILE of one "
                        "that does, or --tool-call-format.", "tools")
    named = isinstance(choice, str)
    return Tools(tuple(tools), fmt, parallel and not named,
                 "" if choice is False else _opener(fmt, choice if named else None))


def history_calls(calls, where: str) -> list:
    """An assistant message's `tool_calls` as chat templates read them: each call's
    `function.arguments` a mapping (OpenAI sends a JSON string; Hugging Face's templates
    iterate or `tojson` a dict). ToolError naming the field otherwise."""
    if not isinstance(calls, list):
        raise ToolError(f"Invalid value for '{where}': expected a list of tool calls.", where)
    out = []
    for j, call in enumerate(calls):
        at = f"{where}[{j}]"
        fn = call.get("function") if isinstance(call, dict) else None
        if not (isinstance(fn, dict) and isinstance(fn.get("name"), str)):
            raise ToolError(f"Invalid value for '{at}': expected {{\"type\": \"function\", "
                            f"\"function\": {{\"name\": ..., \"arguments\": ...}}}}.", at)
        args = fn.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except ValueError:
                args = None
        if not isinstance(args, dict):
            raise ToolError(f"Invalid value for '{at}.function.arguments': expected a JSON "
                            f"object (or its text).", f"{at}.function.arguments")
        out.append({**call, "function": {**fn, "arguments": args}})
    return out


# ---------------------------------------------------------------------- reading a reply

def _call(name: str, arguments) -> dict:
    args = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": name, "arguments": args}}


def _json_call(obj):
    """(name, arguments) of a {"name": ..., "arguments": {...}} object, else None."""
    if not (isinstance(obj, dict) and isinstance(obj.get("name"), str)):
        return None
    args = obj.get("arguments", {})
    return (obj["name"], args) if isinstance(args, (dict, str)) else None


def _hermes(block: str, tools: Tools):
    try:
        call = _json_call(json.loads(block))
    except ValueError:
        return None
    return None if call is None else [call]


def _toolcall(block: str, tools: Tools):
    try:
        objs = json.loads(block)
    except ValueError:
        return None
    calls = [_json_call(o) for o in (objs if isinstance(objs, list) else [objs])]
    return None if not calls or None in calls else calls


def _typed(value: str, schema) -> object:
    """A parameter's text as its schema's type: text for strings (or no type), else JSON when
    it parses (booleans in any case), else the text."""
    kind = schema.get("type") if isinstance(schema, dict) else None
    kinds = set(kind) if isinstance(kind, list) else {kind}
    if kind is None or "string" in kinds:
        return value
    try:
        return json.loads(value.lower() if value.lower() in ("true", "false") else value)
    except ValueError:
        return value


def _xml(block: str, tools: Tools):
    functions = _FUNCTION.findall(block)
    if not functions or _FUNCTION.sub("", block).strip():
        return None
    calls = []
    for name, body in functions:
        name = name.strip()
        props = tools.schema(name).get("properties", {})
        params = _PARAMETER.findall(body)
        if _PARAMETER.sub("", body).strip():
            return None
        args = {}
        for pname, value in params:
            pname = pname.strip()
            value = value[1:] if value.startswith("\n") else value     # the template's layout
            value = value[:-1] if value.endswith("\n") else value
            args[pname] = _typed(value, props.get(pname) if isinstance(props, dict) else None)
        calls.append((name, args))
    return calls


_PARSERS = {"hermes": _hermes, "xml": _xml, "toolcall": _toolcall}


def split_reply(text: str, tools: Tools) -> tuple[str | None, list]:
    """(content, tool_calls) of a whole reply (the text generated after its forced start, if
    any): the text outside the tool-call blocks (None when only whitespace is left) and OpenAI's
    tool_calls objects; (the reply, []) when it holds no block, or one that does not parse or
    close."""
    text = tools.forced + text
    start, end = _TAGS[tools.format]
    outside, calls, pos = [], [], 0
    while (i := text.find(start, pos)) >= 0:
        j = text.find(end, i + len(start))
        if j < 0:
            return text, []
        got = _PARSERS[tools.format](text[i + len(start):j].strip(), tools)
        if got is None:
            return text, []
        outside.append(text[pos:i])
        calls += got
        pos = j + len(end)
    if not calls:
        return text, []
    outside.append(text[pos:])
    content = "".join(outside).strip()
    calls = calls if tools.parallel else calls[:1]
    return content or None, [_call(name, args) for name, args in calls]


def call_tag(tools: Tools | None) -> str | None:
    """The tag a tool call starts with in the request's format (None without tools)."""
    return None if tools is None else _TAGS[tools.format][0]


class ToolStream:
    """A streamed reply split as `split_reply` splits it: `push(piece)` returns the content to
    send now (up to a tool-call block's start tag; a piece's tail that may begin one waits for
    the next), `finish()` the content left and the tool calls once the reply is whole."""

    def __init__(self, tools: Tools):
        self.tools, self.tag = tools, _TAGS[tools.format][0]
        self.held = ""                  # a tail that may start the tag
        # everything from the first tag on (a forced start is in a block from the first piece)
        self.rest: str | None = "" if tools.forced else None

    def push(self, piece: str) -> str:
        if self.rest is not None:
            self.rest += piece
            return ""
        text = self.held + piece
        if (i := text.find(self.tag)) >= 0:
            self.rest, self.held = text[i:], ""
            return text[:i]
        keep = tag_start(text, self.tag)
        self.held = text[len(text) - keep:]
        return text[:len(text) - keep]

    def finish(self) -> tuple[str, list]:
        """(content not yet sent, tool_calls)."""
        if self.rest is None:
            return self.held, []
        content, calls = split_reply(self.rest, self.tools)
        return content or "", calls
