"""The tiny model's tokenizer: a byte-level BPE for the prompts, with the chat markup, the mode tokens and
the script's pieces added whole, so that each piece is one token."""

from __future__ import annotations

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

from runtime.engine.tinymodel.corpus import training_texts
from runtime.engine.tinymodel.script import (
    END_OF_TEXT,
    MODE_TOKENS,
    PIECES,
    THINK_END,
    THINK_START,
    TURN_END,
    TURN_START,
)

BPE_VOCAB_SIZE = 8000  # a ceiling: the corpus runs out of merges at about 3,000 tokens


def build_tokenizer() -> Tokenizer:
    """A byte-level BPE trained on `corpus`, plus the chat markup, mode tokens and reply pieces."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=BPE_VOCAB_SIZE,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(training_texts(), trainer)
    tokenizer.add_special_tokens([token(t, special=True) for t in (END_OF_TEXT, TURN_START, TURN_END, *MODE_TOKENS)])
    tokenizer.add_tokens([token(t, special=False) for t in (THINK_START, THINK_END, *PIECES)])
    return tokenizer


def token(content: str, *, special: bool) -> AddedToken:
    return AddedToken(content, special=special, normalized=False)
