"""Chat templates rendered as Hugging Face's apply_chat_template renders them."""

import json

import pytest

from replayjax.demo import model_dir
from replayjax.server.chat import ChatTemplateError, load_chat_template

LLAMA_LIKE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] | trim + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{% generation %}{{ ' ' + message['content'] | trim "
    "+ eos_token }}{% endgeneration %}{% endif %}{% endfor %}")


def write(tmp_path, config, jinja=None):
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    if jinja is not None:
        (tmp_path / "chat_template.jinja").write_text(jinja)
    return str(tmp_path)


def test_demo_template():
    t = load_chat_template(model_dir())
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert t.render(msgs) == "System: Be brief.\nUser: Hi\nAssistant:"


def test_special_tokens_raise_exception_and_generation_tags(tmp_path):
    d = write(tmp_path, {"chat_template": LLAMA_LIKE, "bos_token": "<s>",
                         "eos_token": {"content": "</s>", "lstrip": False}})
    t = load_chat_template(d)
    msgs = [{"role": "user", "content": "a "}, {"role": "assistant", "content": "b"},
            {"role": "user", "content": "c"}]
    assert t.render(msgs) == "<s>[INST] a [/INST] b</s>[INST] c [/INST]"
    with pytest.raises(ChatTemplateError, match="roles must alternate"):
        t.render(msgs[1:])


def test_jinja_file_wins_and_named_templates(tmp_path):
    named = [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]
    assert load_chat_template(write(tmp_path, {"chat_template": named})).render([]) == "D"
    d = write(tmp_path, {"chat_template": "config"}, jinja="{{ messages | tojson }}")
    assert load_chat_template(d).render([{"role": "user", "content": "é"}]) == \
        '[{"role": "user", "content": "é"}]'


def test_kwargs_reach_the_template(tmp_path):
    d = write(tmp_path, {"chat_template": "{% if enable_thinking %}T{% else %}F{% endif %}"})
    t = load_chat_template(d)
    assert t.render([]) == "F" and t.render([], {"enable_thinking": True}) == "T"
    assert t.render([], {"messages": 1, "add_generation_prompt": False}) == "F"   # ours win


def test_no_template_and_broken_ones(tmp_path):
    assert load_chat_template(write(tmp_path, {})) is None
    with pytest.raises(ChatTemplateError, match="line 1"):
        load_chat_template(write(tmp_path, {"chat_template": "{% for %}"}))
    t = load_chat_template(write(tmp_path, {"chat_template": "{{ messages[0]['content'] + 1 }}"}))
    with pytest.raises(ChatTemplateError, match="the chat template failed"):
        t.render([{"role": "user", "content": "x"}])
