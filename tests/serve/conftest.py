"""A tiny GPT-2 directory with a real tokenizer, and the server running on a free loopback port."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import uvicorn
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from orion.models import GPT2, GPT2Config
from orion.models.gpt2.weights import save_hf
from orion.serve.app import Limits, create_app
from orion.serve.model_engine import ModelEngine
from support.gpt2_fixtures import lively_weights

EOS = "<|endoftext|>"
CORPUS = [
    "the neural engine runs the model one token at a time",
    "hello world, hello engine; the server answers every client",
    "café 🙂 naïve 日本語のテキスト and emoji 🚀 in the stream",
    "stop strings end the text; the length limit ends it too",
]
# A chat template in Hugging Face's format, refusing a conversation that starts with the assistant.
CHAT_TEMPLATE = (
    "{% if messages[0]['role'] == 'assistant' %}{{ raise_exception('start with a user or system message') }}"
    "{% endif %}{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{{ eos_token }}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)
LIMITS = Limits(max_body_bytes=64 * 1024, body_timeout=1.0, send_timeout=5.0, disconnect_poll=0.05)


def write_model(directory: Path, chat_template: str | None = CHAT_TEMPLATE, context: int = 128) -> Path:
    """A 2-layer GPT-2 in the Hugging Face layout whose vocabulary is exactly its byte-level BPE tokenizer's."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=[EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    config = GPT2Config(n_layer=2, n_head=4, n_embd=64, vocab_size=tok.get_vocab_size(), n_positions=context)
    save_hf(directory, config, lively_weights(config, seed=3))
    hf_config = json.loads((directory / "config.json").read_text())  # EOS/BOS ids as this tokenizer has them
    hf_config["eos_token_id"] = hf_config["bos_token_id"] = tok.token_to_id(EOS)
    (directory / "config.json").write_text(json.dumps(hf_config))
    tok.save(str(directory / "tokenizer.json"))
    if chat_template is not None:
        (directory / "tokenizer_config.json").write_text(json.dumps(
            {"chat_template": chat_template, "eos_token": EOS, "bos_token": EOS, "tokenizer_class": "GPT2Tokenizer"}))
    return directory


@contextmanager
def serving(app) -> Iterator[str]:  # noqa: ANN001
    """Run ``app`` with uvicorn in a thread on a free loopback port; yields its base URL."""
    listener = socket.create_server(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start within 10 s"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)
        listener.close()
        assert not thread.is_alive(), "the server did not stop within 10 s"


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> Path:
    return write_model(tmp_path_factory.mktemp("gpt2-serve"))


@pytest.fixture(scope="session")
def reference(model_dir) -> GPT2:
    """An instance of its own, independent of the server's, for the expected outputs."""
    return GPT2.from_pretrained(model_dir, progress=False)


@pytest.fixture(scope="session")
def engine(model_dir) -> ModelEngine:
    return ModelEngine.from_directory(model_dir, progress=False, max_sequences=4)


@pytest.fixture(scope="module")
def base_url(engine) -> Iterator[str]:
    with serving(create_app(engine, max_waiting=32, limits=LIMITS)) as url:
        yield url
