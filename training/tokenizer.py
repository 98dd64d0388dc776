"""Byte-level BPE tokenizers trained on the embedded corpus, saved as transformers fast tokenizers.

Byte-level means every string round-trips (no unknown token) and the tokenizer works on any
text a sweep feeds it. ``<|endoftext|>`` is the only special token and serves as BOS, EOS and
padding, as in GPT-2.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

END_OF_TEXT = "<|endoftext|>"
TRAINING_CHUNK_CHARS = 8192


def _text_chunks(text: str, chunk_chars: int) -> Iterator[str]:
    """Yield consecutive pieces of ``text`` of about ``chunk_chars``, cut after a newline."""
    start = 0
    while start < len(text):
        end = min(start + chunk_chars, len(text))
        if end < len(text):
            newline = text.rfind("\n", start, end)
            end = newline + 1 if newline > start else end
        yield text[start:end]
        start = end


def train_bpe_tokenizer(
    text: str, vocab_size: int, model_max_length: int = 2048
) -> PreTrainedTokenizerFast:
    """Return a byte-level BPE tokenizer with ``vocab_size`` entries trained on ``text``.

    The 256 byte symbols and ``<|endoftext|>`` are always in the vocabulary; the rest are merges.
    Training is deterministic for a given text and vocabulary size.
    """
    if vocab_size <= 257:
        raise ValueError(f"vocab_size must exceed the 256 bytes + 1 special token: {vocab_size}")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[END_OF_TEXT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_text_chunks(text, TRAINING_CHUNK_CHARS), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=END_OF_TEXT,
        eos_token=END_OF_TEXT,
        pad_token=END_OF_TEXT,
        model_max_length=model_max_length,
    )


def save_tokenizer(tokenizer: PreTrainedTokenizerFast, directory: Path) -> Path:
    """Save ``tokenizer`` so ``AutoTokenizer.from_pretrained(directory)`` loads it; return dir."""
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(str(directory))
    return directory


def encode_corpus(tokenizer: PreTrainedTokenizerFast, text: str) -> list[int]:
    """Return the token ids of ``text`` (no special tokens added), encoded in parallel chunks.

    Chunks end at newlines, so splitting can change tokens only at the chunk boundaries (a
    newline followed by indentation may be split into two tokens there instead of one).
    """
    chunks = list(_text_chunks(text, TRAINING_CHUNK_CHARS))
    encodings = tokenizer.backend_tokenizer.encode_batch(chunks, add_special_tokens=False)
    return [token for encoding in encodings for token in encoding.ids]
