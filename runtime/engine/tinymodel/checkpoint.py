"""The tiny model as vLLM loads it: config, generation config, tokenizer (with the chat template) and weights,
written to a directory, the same bytes on every call."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from safetensors.torch import save_file
from tokenizers import Tokenizer

from runtime.engine.tinymodel.script import ANSWERS, END_OF_TEXT, EOS, Script
from runtime.engine.tinymodel.template import CHAT_TEMPLATE
from runtime.engine.tinymodel.tokenizer import build_tokenizer
from runtime.engine.tinymodel.weights import (
    HEAD_DIM,
    HIDDEN_SIZE,
    INTERMEDIATE_SIZE,
    MAX_POSITIONS,
    NUM_LAYERS,
    ROPE_THETA,
    weights,
)


def write_checkpoint(directory: Path, answer: str = "hello") -> Path:
    """Write the complete model (config, weights, tokenizer and chat template) into `directory`; `answer` names its
    plain reply (script.ANSWERS). Deterministic: the same bytes on every call. Returns `directory`."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    script = Script.of(tokenizer.get_vocab(), ANSWERS[answer])
    vocab_size = -(-tokenizer.get_vocab_size() // 64) * 64
    (directory / "tokenizer.json").write_text(tokenizer.to_str(pretty=True))
    write_json(directory / "tokenizer_config.json", tokenizer_config())
    write_json(directory / "config.json", model_config(tokenizer, vocab_size))
    write_json(directory / "generation_config.json", generation_config(tokenizer))
    save_file(weights(script, vocab_size), directory / "model.safetensors", metadata={"format": "pt"})
    return directory


def model_config(tokenizer: Tokenizer, vocab_size: int) -> dict[str, Any]:
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": vocab_size,
        "hidden_size": HIDDEN_SIZE,
        "intermediate_size": INTERMEDIATE_SIZE,
        "num_hidden_layers": NUM_LAYERS,
        "num_attention_heads": 1,
        "num_key_value_heads": 1,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "max_position_embeddings": MAX_POSITIONS,
        "rms_norm_eps": 1e-6,
        "rope_theta": ROPE_THETA,
        "attention_bias": False,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",  # what vLLM runs a float32 checkpoint in anyway; the margins are wide
        "bos_token_id": tokenizer.token_to_id(END_OF_TEXT),
        "eos_token_id": tokenizer.token_to_id(EOS),
        "pad_token_id": tokenizer.token_to_id(END_OF_TEXT),
    }


def generation_config(tokenizer: Tokenizer) -> dict[str, Any]:
    # No sampling defaults: a client that sends no temperature gets vLLM's own (1.0).
    return {
        "bos_token_id": tokenizer.token_to_id(END_OF_TEXT),
        "eos_token_id": [tokenizer.token_to_id(EOS), tokenizer.token_to_id(END_OF_TEXT)],
        "pad_token_id": tokenizer.token_to_id(END_OF_TEXT),
    }


def tokenizer_config() -> dict[str, Any]:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": EOS,
        "pad_token": END_OF_TEXT,
        "add_bos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": MAX_POSITIONS,
        "chat_template": CHAT_TEMPLATE,
    }


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
