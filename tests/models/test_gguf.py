"""GGUF files of every family Orion runs (llama -- Llama, Mistral, SmolLM --, qwen2, gpt2) load through
``orion.models.load`` and match transformers' own GGUF loader (``from_pretrained(dir, gguf_file=...)``).

The files are written from small random transformers models in llama.cpp's layout (support/gguf_files.py);
read back by transformers in F32 they give the original model (which checks the layout, q/k permutation
included). Tolerances: logits within 3% of the largest (Orion runs fp16 activations, as in the other
model tests); greedy tokens over 8 steps equal; token ids equal."""

from __future__ import annotations

import json

import numpy as np
import pytest

import orion
from orion import models
from orion.models.gguf import GGUFError
from support import references
from support.gguf_files import write_gguf
from support.text_fixtures import EOS, byte_level_tokenizer

VOCAB = 384
IDS = [5, 17, 3, 99, 42, 7, 250, 11]
TEXTS = ["hello world, hello engine", "café naïve 🙂 日本語", f"the model{EOS}runs <extra_3> twice  "]
TEMPLATE = "{% for m in messages %}{{ '<|' + m['role'] + '|>' + m['content'] + eos_token }}{% endfor %}"


def hf_model(tmp_path, family: str):
    """A saved transformers model of ``family`` with lively random weights and a byte-level tokenizer."""
    torch, transformers = references.require("torch", "transformers")
    torch.manual_seed(0)
    if family == "gpt2":
        # n_positions 1024: transformers' GGUF loader leaves GPT-2's at its default (it reads no gpt2.context_length)
        config = transformers.GPT2Config(n_layer=2, n_head=4, n_embd=64, vocab_size=VOCAB, n_positions=1024,
                                         initializer_range=0.2, bos_token_id=0, eos_token_id=0)
        model = transformers.GPT2LMHeadModel(config)
    else:
        common = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=16, vocab_size=VOCAB, max_position_embeddings=64,
                      rope_theta=100000.0, initializer_range=0.2, rms_norm_eps=1e-5)
        if family == "qwen2":
            config = transformers.Qwen2Config(**common, tie_word_embeddings=False)
            model = transformers.Qwen2ForCausalLM(config)
        else:
            config = transformers.LlamaConfig(**common, tie_word_embeddings=True)
            model = transformers.LlamaForCausalLM(config)
    with torch.no_grad():  # norms away from 1 and non-zero biases, so a misplaced one shows
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.copy_(1 + 0.3 * torch.randn_like(p) if "norm" in name or "ln" in name else 0.3 * torch.randn_like(p))
    directory = tmp_path / family
    model.save_pretrained(directory)
    byte_level_tokenizer(VOCAB).save(str(directory / "tokenizer.json"))
    return directory


def hf_logits(directory, ids, gguf_file=None) -> np.ndarray:
    torch, transformers = references.require("torch", "transformers")
    kwargs = {"gguf_file": gguf_file} if gguf_file else {}
    model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32, **kwargs).eval()
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].numpy()


@pytest.mark.parametrize("family, qtype", [("llama", "F32"), ("llama", "Q8_0"), ("llama", "Q4_1"), ("qwen2", "Q4_0"),
                                           ("qwen2", "F16"), ("gpt2", "Q8_0")])
def test_gguf_files_match_transformers_gguf_loader(tmp_path, family, qtype) -> None:
    directory = hf_model(tmp_path, family)
    path = write_gguf(directory, directory / f"model-{qtype}.gguf", qtype, chat_template=TEMPLATE)
    want = hf_logits(directory, IDS, path.name)
    if qtype == "F32":  # the file is laid out as llama.cpp lays it out (transformers undoes the same permutation)
        np.testing.assert_allclose(want, hf_logits(directory, IDS), rtol=0, atol=1e-4)
    model = models.load(path, progress=False)
    assert type(model) is models.registry.model_class(path)
    got = model.logits(IDS)
    np.testing.assert_allclose(got, want, rtol=0, atol=0.03 * float(np.abs(want).max()))
    assert np.argmax(got, 1).tolist() == np.argmax(want, 1).tolist()
    torch, transformers = references.require("torch", "transformers")
    theirs = transformers.AutoModelForCausalLM.from_pretrained(directory, gguf_file=path.name,
                                                               dtype=torch.float32).eval()
    with torch.no_grad():
        greedy = theirs.generate(torch.tensor([IDS[:3]]), max_new_tokens=8, do_sample=False, min_new_tokens=8,
                                 pad_token_id=0)[0, 3:].tolist()
    assert list(model.generate(IDS[:3], 8, temperature=0)) == greedy


def test_the_gguf_tokenizer_and_template_match_transformers(tmp_path) -> None:
    (transformers,) = references.require("transformers")
    directory = hf_model(tmp_path, "llama")
    path = write_gguf(directory, directory / "model.gguf", "Q8_0", chat_template=TEMPLATE)
    ours = models.load_tokenizer(path)
    theirs = transformers.AutoTokenizer.from_pretrained(directory, gguf_file=path.name)
    original = byte_level_tokenizer(VOCAB)
    for text in TEXTS:
        ids = ours.encode(text)
        assert ids == theirs.encode(text, add_special_tokens=False) == original.encode(text).ids
        assert ours.decode(ids) == text
    messages = [{"role": "user", "content": "hello"}]
    assert ours.apply_chat_template(messages) == f"<|user|>hello{EOS}"
    assert ours.eos_token_ids == (original.token_to_id(EOS),) and not ours.add_bos


def test_what_orion_does_not_implement_is_refused_by_name(tmp_path) -> None:
    directory = hf_model(tmp_path, "llama")
    cases = [({"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 2.0}, "rope.scaling.type"),
             ({"llama.expert_count": 8}, "expert_count")]
    for i, (extra, key) in enumerate(cases):
        path = write_gguf(directory, directory / f"bad{i}.gguf", "Q8_0", extra=extra)
        with pytest.raises(GGUFError, match=key) as err:
            models.load(path, progress=False)
        assert isinstance(err.value, orion.OrionError) and str(path) in str(err.value)
    path = write_gguf(directory, directory / "pre.gguf", "Q8_0", pre="no-such-pre")
    model = models.load(path, progress=False)  # the model loads; text in/out says why it cannot
    with pytest.raises(orion.OrionError, match="pre-tokenizer 'no-such-pre' is not implemented"):
        model.tokenizer  # noqa: B018
    (tmp_path / "junk.gguf").write_bytes(b"GGUF" + b"\0" * 12)
    with pytest.raises(GGUFError, match="junk.gguf"):
        models.load(tmp_path / "junk.gguf")
    config = json.loads((directory / "config.json").read_text())
    assert config["model_type"] == "llama"


CORPUS = ["the neural engine runs the model", "hello world, hello engine", "a quick brown fox jumps over the lazy dog",
          "models run on the engine; the engine runs models", "tokens and pieces and merges"] * 20
SPM_TEXTS = ["hello world", "the engine runs  twice\nand again", "café 🙂 unseen ±", " leading space", "models"]


def sentencepiece_gguf(tmp_path, add_space_prefix: bool = True):
    """A SentencePiece BPE model trained here (byte fallback, no normalization, as Llama's) and the
    GGUF file whose tokenizer.ggml.* keys llama.cpp's converter writes for it (type "llama")."""
    (spm,) = references.require("sentencepiece")
    import gguf

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(CORPUS))
    spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(tmp_path / "spm"), vocab_size=400,
                                   model_type="bpe", byte_fallback=True, normalization_rule_name="identity",
                                   remove_extra_whitespaces=False, add_dummy_prefix=add_space_prefix,
                                   bos_id=1, eos_id=2, unk_id=0, minloglevel=2)
    sp = spm.SentencePieceProcessor(model_file=str(tmp_path / "spm.model"))
    n = sp.get_piece_size()
    kinds = [2 if sp.is_unknown(i) else 3 if sp.is_control(i) else 6 if sp.is_byte(i) else 1 for i in range(n)]
    writer = gguf.GGUFWriter(str(tmp_path / "spm.gguf"), "llama")
    writer.add_tokenizer_model("llama")
    writer.add_token_list([sp.id_to_piece(i) for i in range(n)])
    writer.add_token_scores([sp.get_score(i) for i in range(n)])
    writer.add_token_types(kinds)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_space_prefix(add_space_prefix)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return sp, tmp_path / "spm.gguf"


@pytest.mark.parametrize("add_space_prefix", [True, False])
def test_a_sentencepiece_vocabulary_encodes_as_sentencepiece(tmp_path, add_space_prefix) -> None:
    """llama.cpp's 'llama' vocabulary type (Llama 2, Mistral, TinyLlama): the reference is the
    sentencepiece library itself on the model the file was made from."""
    from orion.models.gguf import GGUFFile
    from orion.models.gguf.tokenizer import gguf_tokenizer

    sp, path = sentencepiece_gguf(tmp_path, add_space_prefix)
    ours = gguf_tokenizer(GGUFFile(path))
    assert ours.add_bos and ours.bos_token_id == 1 and ours.eos_token_ids == (2,)
    for text in SPM_TEXTS:
        assert ours.encode(text, add_special_tokens=False) == sp.encode(text), text
        assert ours.decode(ours.encode(text)[1:]) == sp.decode(sp.encode(text))
    assert ours.encode("hello")[0] == 1


def test_the_cli_and_the_server_take_a_gguf_file(tmp_path, capsys) -> None:
    from orion.__main__ import main
    from orion.serve import cli
    from orion.serve.model_engine import ModelEngine

    directory = hf_model(tmp_path, "llama")
    path = write_gguf(directory, directory / "model.gguf", "Q8_0", chat_template=TEMPLATE)
    assert main(["generate", "--model", str(path), "--prompt", "hello", "--chat", "--max-new-tokens", "3",
                 "--quiet"]) == 0
    assert capsys.readouterr().out.strip("\n")  # three tokens of text (the random model's)
    parser = cli.build_parser()
    cli._check(parser.parse_args(["--model", str(path)]), parser)  # accepted, not "not a directory"
    engine = ModelEngine.from_directory(path, progress=False)
    assert engine.chat_prompt([{"role": "user", "content": "hi"}]) == f"<|user|>hi{EOS}"


def _same_file_reading(path) -> None:
    """Orion's header parser and the gguf package's GGUFReader read ``path`` alike: metadata, and each tensor's
    name, ggml dims, type and bytes."""
    import gguf

    from orion.models.gguf.reader import _parse, _read_with_package

    ours, theirs = _parse(path, gguf), _read_with_package(path, gguf)
    assert ours[0] == theirs[0]
    assert [t.name for t in ours[1]] == [t.name for t in theirs[1]]
    for a, b in zip(ours[1], theirs[1], strict=True):
        assert a.shape == tuple(int(n) for n in b.shape) and a.tensor_type == b.tensor_type, a.name
        assert a.data.dtype == b.data.dtype and a.data.shape == b.data.shape and np.array_equal(a.data, b.data), a.name


@pytest.mark.parametrize("family, qtype", [("llama", "F32"), ("qwen2", "Q4_0"), ("gpt2", "Q8_0"), ("llama", "F16")])
def test_the_header_parser_reads_written_gguf_files_as_the_gguf_package_does(tmp_path, family, qtype) -> None:
    directory = hf_model(tmp_path, family)
    _same_file_reading(write_gguf(directory, directory / f"model-{qtype}.gguf", qtype, chat_template=TEMPLATE))


def test_the_header_parser_reads_the_real_smollm2_gguf_as_the_gguf_package_does(smollm2_gguf_path) -> None:
    _same_file_reading(smollm2_gguf_path)


def test_a_gguf_file_the_parser_leaves_alone_is_read_by_the_package(tmp_path) -> None:
    """A version-1 header (counts of 32 bits) goes to GGUFReader, whose refusal is the error."""
    path = tmp_path / "v1.gguf"
    path.write_bytes(b"GGUF" + (1).to_bytes(4, "little") + bytes(16))
    with pytest.raises(GGUFError, match="not a readable GGUF file"):
        models.load(path, progress=False)


@pytest.mark.parametrize("family, qtype", [("llama", "Q4_1"), ("qwen2", "F16"), ("gpt2", "Q8_0")])
def test_a_gguf_is_dequantized_once_into_a_copy_that_later_starts_map(tmp_path, monkeypatch, capsys, family,
                                                                      qtype) -> None:
    """With the program cache on, the first load writes every tensor dequantized (llama's q/k rows already in
    rotate-half order) to a float32 copy; a later start maps it and dequantizes only the rows that check it. The
    weights are views of the copy, and logits are bit for bit those of the cache-off load, which dequantizes
    each tensor into memory. A damaged copy is written again with one warning."""
    import gguf

    from orion.models.gguf import _parsed

    path = write_gguf(hf_model(tmp_path, family), tmp_path / f"{family}-{qtype}.gguf", qtype)
    in_memory = models.load(path, progress=False)
    want = in_memory.logits(IDS)
    assert in_memory.weights.source is None
    monkeypatch.setenv("ORION_CACHE_DIR", str(tmp_path / "cache"))
    dequantized = []
    real = gguf.quants.dequantize
    monkeypatch.setattr(gguf.quants, "dequantize", lambda data, kind: dequantized.append(data.size) or real(data, kind))
    total = sum(t.data.size for t in models.gguf.open_gguf(path).tensors.values())
    for start in ("cold", "warm", "damaged"):
        _parsed.cache_clear()  # as a new process
        dequantized.clear()
        if start == "damaged":
            (copy,) = (tmp_path / "cache" / "converted").iterdir()
            copy.write_bytes(copy.read_bytes()[:-4] + bytes(4))  # in the last row of the last tensor
        model = models.load(path, progress=False)
        np.testing.assert_array_equal(model.logits(IDS), want, err_msg=start)
        mapped = model.weights.source.files[0]
        assert all(mapped.offset_of(a) is not None and a.dtype == np.float32 for _, a in model.weights.arrays())
        if start == "warm":
            assert sum(dequantized) < 0.2 * total, (sum(dequantized), total)  # sampled rows only
        else:
            assert sum(dequantized) >= total
        assert capsys.readouterr().err.count("damaged converted copy") == (start == "damaged")
