"""Incremental detokenization and stop strings, against the tokenizer's own decode of all ids."""

from __future__ import annotations

import pytest
import tokenizers
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orion.generation.streaming import IncrementalDetokenizer, StopStrings

CORPUS = ["hello world, café naïve 🙂 日本語のテキスト", "emoji 👩‍👩‍👧 and 한국어 text", "plain ascii words " * 3]


def _byte_level() -> tokenizers.Tokenizer:
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=400, initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    return tok


def _metaspace() -> tokenizers.Tokenizer:
    """SentencePiece-like: '▁' marks spaces, byte fallback for characters outside the vocabulary."""
    tok = tokenizers.Tokenizer(tokenizers.models.BPE(byte_fallback=True, unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Metaspace()
    tok.decoder = tokenizers.decoders.Sequence([
        tokenizers.decoders.Replace("▁", " "), tokenizers.decoders.ByteFallback(), tokenizers.decoders.Fuse(),
        tokenizers.decoders.Strip(" ", 1, 0)])
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=500, special_tokens=["<unk>", *byte_tokens])
    tok.train_from_iterator(CORPUS, trainer)
    return tok


TOKENIZERS = {"byte_level": _byte_level(), "metaspace": _metaspace()}


def _stream(tok: tokenizers.Tokenizer, ids: list[int], prompt: list[int]) -> str:
    detok = IncrementalDetokenizer(lambda xs: tok.decode(list(xs), skip_special_tokens=False), prompt)
    return "".join(detok.push(i) for i in ids) + detok.flush()


@pytest.mark.parametrize("kind", sorted(TOKENIZERS))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(max_size=40), prompt_text=st.text(max_size=10))
def test_joined_stream_equals_decode_of_all_ids(kind, text, prompt_text):
    tok = TOKENIZERS[kind]
    prompt = tok.encode(prompt_text, add_special_tokens=False).ids
    ids = tok.encode(text, add_special_tokens=False).ids
    full = tok.decode(prompt + ids, skip_special_tokens=False)
    expected = full[len(tok.decode(prompt, skip_special_tokens=False)):] if prompt else full
    assert _stream(tok, ids, prompt) == expected


def test_multibyte_characters_are_never_split():
    tok = TOKENIZERS["byte_level"]
    text = " café 🙃 naïve ☃"  # 🙃 and ☃ are not in the training corpus: split over byte tokens
    ids = tok.encode(text, add_special_tokens=False).ids
    detok = IncrementalDetokenizer(lambda xs: tok.decode(list(xs)))
    chunks = [detok.push(i) for i in ids] + [detok.flush()]
    assert "".join(chunks) == text
    assert all("\ufffd" not in c for c in chunks)
    assert len(ids) > len([c for c in chunks if c])  # some tokens carried partial characters


@given(pieces=st.lists(st.text(alphabet="ab\nc", max_size=4), max_size=12),
       stops=st.lists(st.text(alphabet="ab\nc", min_size=1, max_size=3), min_size=1, max_size=3))
def test_stop_strings_match_across_chunks_and_leave_no_partial_match(pieces, stops):
    matcher = StopStrings(stops)
    shown, stopped = "", False
    for piece in pieces:
        result = matcher.feed(piece)
        shown += result.text
        if result.stopped:
            stopped = True
            break
    if not stopped:
        shown += matcher.finish()
    # The stream stops at the first piece after which the text so far holds a stop string, cut where the earliest
    # of those starts (as OpenAI's API and vLLM do: a stop that has completed is not held back for a longer one
    # that might still complete at an earlier start, e.g. pieces "ac", "b" with stops "c" and "acb" show "a").
    so_far = ""
    for piece in pieces:
        so_far += piece
        starts = [so_far.find(s) for s in stops if s in so_far]
        if starts:
            assert stopped and shown == so_far[:min(starts)]
            return
    assert not stopped and shown == so_far


def test_stop_string_split_over_tokens_is_held_back():
    matcher = StopStrings(["\n\n"])
    assert matcher.feed("Hello\n").text == "Hello"  # "\n" may start the stop: held
    result = matcher.feed("\nrest")
    assert result.stopped and result.text == "" and result.stop == "\n\n"
