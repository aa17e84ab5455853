"""Chat templates: a model's Jinja template rendered the way Hugging Face's
`apply_chat_template` renders it (sandboxed, `trim_blocks` and `lstrip_blocks`, the loop-control
extension, `raise_exception`, `tojson`, `strftime_now` and the `{% generation %}` tag), with
`messages`, `add_generation_prompt=True` and the special tokens of `tokenizer_config.json`.
"""

from __future__ import annotations

import datetime
import json
import os

import jinja2
import jinja2.ext
import jinja2.sandbox

from replayjax.commandline import UserError

TEMPLATE_FILE = "chat_template.jinja"
CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token",
                  "mask_token")


class ChatTemplateError(UserError, ValueError):
    """A template that does not compile (raised when loading), or a conversation the template
    refuses (`raise_exception`, or an error while rendering)."""


class _GenerationTag(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` (marks assistant text for training masks in
    Hugging Face): rendered as its body."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
        return caller()


def _raise_exception(message):
    raise ChatTemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(fmt):
    return datetime.datetime.now().strftime(fmt)


class ChatTemplate:
    """A compiled chat template and the special tokens it is rendered with."""

    def __init__(self, source: str, special_tokens: dict, where: str = "chat template"):
        env = jinja2.sandbox.ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True,
            extensions=[_GenerationTag, jinja2.ext.loopcontrols])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        try:
            self.template = env.from_string(source)
        except jinja2.TemplateSyntaxError as e:
            raise ChatTemplateError(f"{where}: line {e.lineno}: {e.message}") from None
        self.source, self.special_tokens = source, special_tokens

    def render(self, messages: list[dict], extra: dict | None = None) -> str:
        """The prompt text for `messages` (dicts with "role" and "content"), ending with the
        template's generation prompt. `extra` variables (e.g. enable_thinking) go to the
        template too. ChatTemplateError when the template refuses the conversation."""
        try:
            return self.template.render(**{**self.special_tokens, **(extra or {}),
                                           "messages": messages, "add_generation_prompt": True})
        except ChatTemplateError:
            raise
        except jinja2.TemplateError as e:
            raise ChatTemplateError(f"the chat template failed: {e}") from None
        except Exception as e:          # noqa: BLE001 -- any error of the template's own code
            raise ChatTemplateError(f"the chat template failed ({type(e).__name__}: {e})") \
                from None


def _token_text(value):
    """A special token as tokenizer_config.json stores it: a string or an AddedToken dict."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def load_chat_template(model_dir: str, path: str | None = None) -> ChatTemplate | None:
    """The chat template of a model directory: `path` if given, else MODEL/chat_template.jinja,
    else tokenizer_config.json's "chat_template" (a string, or a list of named templates: the
    one named "default"); None when there is none. ChatTemplateError for a template that does
    not compile or a tokenizer_config.json that does not parse."""
    config_path = os.path.join(model_dir, CONFIG_FILE)
    config = {}
    if os.path.isfile(config_path):
        try:
            with open(config_path, encoding="utf-8") as f:
                config = json.load(f)
        except (OSError, ValueError) as e:
            raise ChatTemplateError(f"{config_path}: cannot read it ({e})") from None
    special = {k: t for k in SPECIAL_TOKENS if (t := _token_text(config.get(k))) is not None}
    source, where = None, path
    if path is None and os.path.isfile(os.path.join(model_dir, TEMPLATE_FILE)):
        where = os.path.join(model_dir, TEMPLATE_FILE)
    if where is not None:
        try:
            with open(where, encoding="utf-8") as f:
                source = f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise ChatTemplateError(f"{where}: cannot read it ({e})") from None
    else:
        source, where = config.get("chat_template"), f"{config_path} chat_template"
        if isinstance(source, list):
            source = next((t.get("template") for t in source
                           if isinstance(t, dict) and t.get("name") == "default"), None)
        if source is None:
            return None
        if not isinstance(source, str):
            raise ChatTemplateError(f"{where}: expected a string, got {type(source).__name__}")
    return ChatTemplate(source, special, where)
