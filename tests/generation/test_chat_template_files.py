"""Chat templates are found where transformers saves and reads them: ``chat_template.jinja`` (transformers
5 always writes it there), ``chat_template.json``, ``tokenizer_config.json``'s ``chat_template`` and
``additional_chat_templates/``; chat prompts then render as transformers renders them (the reference:
transformers' own tokenizer loaded from the same directory)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orion.generation.chat import ChatTemplateError
from orion.generation.tokenizer import load_tokenizer
from support import references
from support.text_fixtures import EOS, byte_level_tokenizer

TEMPLATE = ("{% for m in messages %}{{ '<|' + m['role'] + '|>' + m['content'] + eos_token }}{% endfor %}"
            "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}")
OTHER = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]


def tokenizer_dir(directory: Path, **tokenizer_config: object) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    byte_level_tokenizer(512).save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({"eos_token": EOS, "bos_token": EOS,
                                                                 **tokenizer_config}))
    return directory


def test_a_directory_saved_by_transformers_5_chats(tmp_path) -> None:
    (transformers,) = references.require("transformers")
    hf = transformers.PreTrainedTokenizerFast(tokenizer_object=byte_level_tokenizer(512), eos_token=EOS,
                                              bos_token=EOS)
    hf.chat_template = TEMPLATE
    hf.save_pretrained(tmp_path)
    assert (tmp_path / "chat_template.jinja").is_file()
    assert "chat_template" not in json.loads((tmp_path / "tokenizer_config.json").read_text())
    ours = load_tokenizer(tmp_path)
    want = transformers.AutoTokenizer.from_pretrained(tmp_path).apply_chat_template(
        MESSAGES, tokenize=False, add_generation_prompt=True)
    assert ours.apply_chat_template(MESSAGES) == want
    assert ours.chat_template.path == tmp_path / "chat_template.jinja"


def test_each_file_transformers_reads_and_its_precedence(tmp_path) -> None:
    directory = tokenizer_dir(tmp_path / "config-only", chat_template=OTHER)
    assert load_tokenizer(directory).apply_chat_template(MESSAGES) == "be briefhello"
    (directory / "chat_template.json").write_text(json.dumps({"chat_template": TEMPLATE}))
    assert load_tokenizer(directory).chat_template.path.name == "chat_template.json"
    (directory / "chat_template.jinja").write_text(OTHER + "!")
    assert load_tokenizer(directory).apply_chat_template(MESSAGES) == "be briefhello!"

    named = tokenizer_dir(tmp_path / "named")
    (named / "additional_chat_templates").mkdir()
    (named / "additional_chat_templates" / "default.jinja").write_text(OTHER)
    assert load_tokenizer(named).apply_chat_template(MESSAGES) == "be briefhello"
    assert load_tokenizer(tokenizer_dir(tmp_path / "none")).chat_template is None


def test_bad_template_files_are_errors_naming_them(tmp_path) -> None:
    directory = tokenizer_dir(tmp_path)
    (directory / "chat_template.json").write_text(json.dumps({"template": TEMPLATE}))
    with pytest.raises(ChatTemplateError, match=r"chat_template.json: no 'chat_template' entry"):
        load_tokenizer(directory)
    (directory / "chat_template.jinja").write_bytes(b"\xff\xfe{{")
    with pytest.raises(ChatTemplateError, match=r"chat_template.jinja: not a readable UTF-8"):
        load_tokenizer(directory)
    (directory / "chat_template.jinja").write_text("{% if %}")
    with pytest.raises(ChatTemplateError, match=r"chat_template.jinja: chat_template line 1"):
        load_tokenizer(directory)
