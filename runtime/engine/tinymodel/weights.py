"""The tiny model's weights: one Qwen3 layer that plays the script, a table of successors in its embedding and
LM head, and one attention head that carries the prompt's mode to `</think>`."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from runtime.engine.tinymodel.script import Script

NUM_LAYERS = 1
HIDDEN_SIZE = 128  # one dimension per token that some token leads to (26), plus 4 mode groups
HEAD_DIM = 32  # the smallest head vLLM's CPU attention backend supports
INTERMEDIATE_SIZE = 64
MAX_POSITIONS = 131072  # Claude Code's own prompts are 15-25k tokens
ROPE_THETA = 1000000.0
LOGIT_MARGIN = 200.0  # e^-200: the scripted token wins whatever temperature a client samples at
MODE_LOGIT_SHARE = 0.05  # how much of the residual the copied mode holds: it decides only after `</think>`
DEFAULT_LOGIT_SHARE = 0.01  # `</think>` with no mode in sight (raw completions) still leads to ANSWER
MODE_ATTENTION_SCORE = 50.0  # e^50 outweighs 131072 positions that score 0


@dataclass(frozen=True)
class Layout:
    """The residual stream's dimensions, by token id: one per target (a token the script leads to),
    then one per mode group (a distinct `after_think` target)."""

    target: dict[int, int]
    group: dict[int, int]

    @classmethod
    def of(cls, script: Script) -> Layout:
        targets = sorted({*script.follows.values(), *script.after_think.values(), script.default})
        groups = sorted(set(script.after_think.values()))
        if len(targets) + len(groups) > HIDDEN_SIZE or len(groups) > HEAD_DIM:
            raise ValueError("the script does not fit in the model's dimensions")
        return cls({t: i for i, t in enumerate(targets)}, {t: len(targets) + i for i, t in enumerate(groups)})


def weights(script: Script, vocab_size: int) -> dict[str, torch.Tensor]:
    """One Qwen3 layer whose MLP adds nothing and whose single attention head copies the mode.

    The next token is read off the current one (`lookup`), except after `</think>`, where the
    mode copied from the prompt decides (`mode_head`).
    """
    layout = Layout.of(script)
    embed, lm_head = lookup(script, layout, vocab_size)
    layer = mode_head(layout) | {
        "input_layernorm.weight": torch.ones(HIDDEN_SIZE),
        "post_attention_layernorm.weight": torch.ones(HIDDEN_SIZE),
        "mlp.gate_proj.weight": torch.zeros(INTERMEDIATE_SIZE, HIDDEN_SIZE),
        "mlp.up_proj.weight": torch.zeros(INTERMEDIATE_SIZE, HIDDEN_SIZE),
        "mlp.down_proj.weight": torch.zeros(HIDDEN_SIZE, INTERMEDIATE_SIZE),  # zero: the MLP adds nothing
    }
    tensors = {f"model.layers.0.{name}": tensor for name, tensor in layer.items()}
    tensors |= {"model.embed_tokens.weight": embed, "lm_head.weight": lm_head}
    tensors["model.norm.weight"] = torch.ones(HIDDEN_SIZE)
    return {name: tensors[name].to(torch.bfloat16) for name in sorted(tensors)}


def lookup(script: Script, layout: Layout, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The embedding and LM head: a table of successors.

    The embedding of t is the one-hot of its successor's dimension (plus, for a mode token, the
    one-hot of its group); the LM head row of a target reads its own dimension. After the final
    RMSNorm the one-hot is sqrt(d) long: the successor's logit is LOGIT_MARGIN, the others 0.
    """
    embed = torch.zeros(vocab_size, HIDDEN_SIZE)
    for t in range(vocab_size):
        embed[t, layout.target[script.follows.get(t, script.default)]] = 1.0
    embed[script.think_end] *= DEFAULT_LOGIT_SHARE  # all but empty: the copied mode decides
    for mode, target in script.after_think.items():
        embed[mode, layout.group[target]] = 1.0
    lm_head = torch.zeros(vocab_size, HIDDEN_SIZE)
    for t, dim in layout.target.items():
        lm_head[t, dim] = LOGIT_MARGIN / HIDDEN_SIZE**0.5
    return embed, lm_head


def mode_head(layout: Layout) -> dict[str, torch.Tensor]:
    """The attention head: every query matches the key of the prompt's (one) mode token, whose value
    writes MODE_LOGIT_SHARE of its `after_think` target into every later position. That share
    loses to any token's own successor, and wins at `</think>` alone, whose embedding is all but
    empty.
    """
    # q and k sit on the last head dimension: in both RoPE layouts it pairs with the lowest
    # frequency (1e6^-(30/32) rad per position), so the score barely moves over 131072 positions.
    rope_dim, first_group = HEAD_DIM - 1, len(layout.target)
    q_proj = torch.zeros(HEAD_DIM, HIDDEN_SIZE)
    q_proj[rope_dim, :first_group] = 1.0  # every token asks
    k_proj = torch.zeros(HEAD_DIM, HIDDEN_SIZE)
    k_proj[rope_dim, first_group:] = 1.0  # only mode tokens answer
    qk_norm = torch.ones(HEAD_DIM)
    qk_norm[rope_dim] = (MODE_ATTENTION_SCORE / HEAD_DIM**0.5) ** 0.5  # score = q.k / sqrt(HEAD_DIM)
    v_proj = torch.zeros(HEAD_DIM, HIDDEN_SIZE)
    o_proj = torch.zeros(HIDDEN_SIZE, HEAD_DIM)
    normalised_one = (HIDDEN_SIZE / 2) ** 0.5  # a mode token's embedding, two ones, after RMSNorm
    for slot, (target, dim) in enumerate(layout.group.items()):
        v_proj[slot, dim] = 1.0 / normalised_one
        o_proj[layout.target[target], slot] = MODE_LOGIT_SHARE
    return {
        "self_attn.q_proj.weight": q_proj,
        "self_attn.k_proj.weight": k_proj,
        "self_attn.v_proj.weight": v_proj,
        "self_attn.o_proj.weight": o_proj,
        "self_attn.q_norm.weight": qk_norm,
        "self_attn.k_norm.weight": qk_norm.clone(),
    }
