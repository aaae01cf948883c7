"""``python -m orion chat`` under a pseudo-terminal (pexpect): two turns whose replies equal the model's own
generate_text on the whole history, Ctrl-C in the middle of a reply (the session goes on, the partial reply
kept in the history), and Ctrl-D to leave."""

from __future__ import annotations

import os
import re
import sys

import pexpect
import pytest

from orion import models
from orion.models import GPT2Config
from support.signals import default_sigint
from support.text_fixtures import write_model_dir

CHAT_TEMPLATE = ("{% for m in messages %}{{ '<|' + m['role'] + '|>' + m['content'] + eos_token }}{% endfor %}"
                 "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}")
CONFIG = GPT2Config(n_layer=4, n_head=4, n_embd=256, vocab_size=512, n_positions=1024)  # ~8 ms a token here
LONG = 150  # tokens a reply may have: the third, about a second long, is interrupted midway
PROMPT = "\r\n> "


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_model_dir(tmp_path_factory.mktemp("gpt2-chat"), CONFIG, chat_template=CHAT_TEMPLATE)


def spawn(model_dir, *args: str):
    env = {**os.environ, "ORION_CACHE_DIR": "off", "TERM": "dumb"}
    child = pexpect.spawn(sys.executable, ["-m", "orion", "chat", "--model", str(model_dir), "--quiet", *args],
                          env=env, encoding="utf-8", timeout=120, dimensions=(50, 2000), preexec_fn=default_sigint)
    child.expect("Ctrl-D or /exit leaves")
    child.expect("> ")
    return child


def reply(child, text: str) -> str:
    child.sendline(text)
    child.expect(PROMPT)
    said = child.before.replace("\r\n", "\n")
    return said.split("\n", 1)[1] if "\n" in said else ""  # after the echoed line


def test_two_turns_ctrl_c_mid_reply_and_eof(model_dir) -> None:
    reference = models.load(model_dir, progress=False)
    system = "be brief"
    history = [{"role": "system", "content": system}]
    child = spawn(model_dir, "--system", system, "--max-new-tokens", str(LONG), "--temperature", "0")
    for turn in ("hello engine", "and the world?"):
        history.append({"role": "user", "content": turn})
        run = reference.generate_text(history, LONG)
        want = "".join(run)
        assert reply(child, turn).rstrip("\n") == want  # the template over the whole history, each turn
        history.append({"role": "assistant", "content": want})
    history.append({"role": "user", "content": "go on"})
    long_run = reference.generate_text(history, LONG)
    full = "".join(long_run)
    assert len(long_run.token_ids) == LONG  # the precondition: a reply long enough to stop midway
    child.sendline("go on")
    child.expect_exact("go on\r\n")
    child.expect(r"\S")  # the reply has started
    child.sendintr()  # Ctrl-C
    first = child.before + child.after  # with the reply's leading spaces (a first token " na")
    child.expect_exact("[stopped]")
    shown = (first + child.before).replace("\r\n", "\n").replace("^C", "").rstrip("\n")  # the terminal echoes ^C
    assert full.startswith(shown) and len(shown) < len(full), (shown, full)  # the start of the reply, cut short
    child.expect(PROMPT)  # the session goes on
    assert child.isalive()
    child.sendline("/reset")
    child.expect(PROMPT)
    history = [{"role": "system", "content": system}, {"role": "user", "content": "hello engine"}]
    assert reply(child, "hello engine").rstrip("\n") == "".join(reference.generate_text(history, LONG))
    child.sendeof()  # Ctrl-D leaves
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0 and not re.search("Traceback", child.before or "")


def test_ctrl_c_at_the_prompt_keeps_the_session(model_dir) -> None:
    child = spawn(model_dir, "--max-new-tokens", "3")
    child.sendintr()
    child.expect("> ")
    child.sendline("/exit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_a_model_without_a_chat_template_is_refused(tmp_path) -> None:
    plain = write_model_dir(tmp_path / "plain", CONFIG)
    child = pexpect.spawn(sys.executable, ["-m", "orion", "chat", "--model", str(plain)], encoding="utf-8",
                          timeout=120, env={**os.environ, "ORION_CACHE_DIR": "off"})
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 1 and "no chat_template" in child.before and "Traceback" not in child.before
