"""A tiny scripted model: a real Qwen3 checkpoint, written in a second, whose replies are known texts.

The tests and the cpu demo need a model that vLLM really serves (no weights can be downloaded here)
and that answers exactly what they expect. The chat template ends the prompt with a *mode token*,
chosen from the LAST user message's text (a string or text blocks) and the template variables:

- no marker: reasoning `THINKING`, then the answer `ANSWER`;
- `MARK_TEXT`, or `enable_thinking` false: `ANSWER` alone;
- `MARK_TOOL`, when tools are given: a hermes tool call of `TOOL_NAME` with `TOOL_ARGUMENTS`;
- `MARK_AGENT`, when tools are given: a call of Claude Code's `AGENT_TOOL`, whose subagent is asked
  `AGENT_PROMPT` (it answers `ANSWER`), in the foreground;
- the last message but system ones is a tool result: `AFTER_TOOL`;
- `MARK_LONG`: `LONG_CYCLE` over and over, until `max_tokens`;
- `MARK_PONDER` (thinking on): reasoning `PONDER_CYCLE` over and over, until vLLM's
  `thinking_token_budget` forces `</think>`; `ANSWER` follows. vLLM counts the mode token, which
  follows `<think>` in the prompt, as the first token of thought: a budget of n gives n - 1.

A tool result wins over the markers, then `MARK_TOOL`, `MARK_AGENT`, `MARK_LONG`, `MARK_PONDER`, `MARK_TEXT`. A
prompt without a mode token (a raw `/v1/completions` one) is answered with `ANSWER`. Serve it with
`--reasoning-parser qwen3 --enable-auto-tool-choice --tool-call-parser hermes`. How the weights
follow the script: see `weights`.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

SERVED_NAME = "tiny"
REASONING_PARSER = "qwen3"  # it honours enable_thinking=false; deepseek_r1 would read the reply as reasoning
TOOL_CALL_PARSER = "hermes"

MARK_TEXT = "[text]"
MARK_TOOL = "[tool]"
MARK_LONG = "[long]"
MARK_PONDER = "[ponder]"
MARK_AGENT = "[agent]"

TOOL_NAME = "Bash"
TOOL_COMMAND = "echo tiny-model-was-here > proof.txt"
AGENT_TOOL = "Agent"  # Claude Code's tool that starts a subagent
AGENT_PROMPT = f"Say hello {MARK_TEXT}"

# Each reply is cut into pieces, one token each. A piece may sit at one place only, since what
# follows a token is a function of that token (and of the mode, for `</think>` alone). Pieces hold
# a space inside, so none is also a token of the trained BPE vocabulary, which never merges across
# a space; the tool call's pieces are spelt so that hermes streams the arguments exactly.
THINKING_PIECES = ("The user", " wants the", " scripted reply,", " so I", " give it", " now.")
ANSWER_PIECES = ("Hello from", " the tiny", " model.")
AFTER_TOOL_PIECES = ("The command", " ran.")
LONG_PIECES = ("On and", " on the", " tiny model", " keeps talking. ")
PONDER_PIECES = ("Let me", " think about", " it once", " more. ")
TOOL_CALL_PIECES = (
    "<tool_call>",
    f'\n{{"name": "{TOOL_NAME}", "arguments": ',
    json.dumps({"command": TOOL_COMMAND}),
    "}\n",
    "</tool_call>",
)
# Its own first and last pieces: `<tool_call>` and `}\n` already lead to the Bash call's pieces. vLLM's
# hermes parser reads the text, not the token ids, so a longer token holding `<tool_call>` is read alike.
AGENT_ARGUMENTS = {"description": "Say hello", "prompt": AGENT_PROMPT, "subagent_type": "general-purpose",
                   "run_in_background": False}  # fmt: skip
AGENT_CALL_PIECES = (
    f'<tool_call>\n{{"name": "{AGENT_TOOL}", "arguments": ',
    json.dumps(AGENT_ARGUMENTS),
    "}\n</tool_call>",
)

THINKING = "".join(THINKING_PIECES)
ANSWER = "".join(ANSWER_PIECES)
AFTER_TOOL = "".join(AFTER_TOOL_PIECES)
LONG_CYCLE = "".join(LONG_PIECES)
PONDER_CYCLE = "".join(PONDER_PIECES)
TOOL_ARGUMENTS = {"command": TOOL_COMMAND}

THINK_START, THINK_END = "<think>", "</think>"
END_OF_TEXT, TURN_START, TURN_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
EOS = TURN_END

# Replies without reasoning, by mode. With thinking on they open with `</think>` (the qwen3 parser
# reads everything before it as reasoning); with thinking off the parser takes the text verbatim.
REPLIES = {"text": ANSWER_PIECES, "tool": TOOL_CALL_PIECES, "agent": AGENT_CALL_PIECES, "after_tool": AFTER_TOOL_PIECES,
           "long": LONG_PIECES}  # fmt: skip
REASONING_MODES = ("think", "ponder")

CHAT_TEMPLATE = (
    "{%- set marks = "
    + json.dumps({"text": MARK_TEXT, "tool": MARK_TOOL, "agent": MARK_AGENT, "long": MARK_LONG, "ponder": MARK_PONDER})
    + """ -%}
{%- macro text(content) -%}
{%- if content is string -%}{{ content }}
{%- elif content is iterable -%}{%- for part in content if part.type == 'text' -%}{{ part.text }}{%- endfor -%}
{%- endif -%}
{%- endmacro -%}
{%- if tools -%}
<|im_start|>system
# Tools
<tools>
{% for tool in tools -%}
{{ tool | tojson }}
{% endfor -%}
</tools><|im_end|>
{% endif -%}
{%- for message in messages -%}
<|im_start|>{{ message.role }}
{{ text(message.content) }}
{%- for call in message.tool_calls or [] %}
<tool_call>
{"name": {{ call.function.name | tojson }}, "arguments": \
{{ call.function.arguments if call.function.arguments is string else call.function.arguments | tojson }}}
</tool_call>
{%- endfor -%}
<|im_end|>
{% endfor -%}
{%- if add_generation_prompt -%}
{%- set thinking = enable_thinking is not defined or enable_thinking -%}
{%- set ns = namespace(asked='', last='') -%}
{%- for message in messages if message.role == 'user' -%}{%- set ns.asked = text(message.content) -%}{%- endfor -%}
{%- for message in messages if message.role != 'system' -%}{%- set ns.last = message.role -%}{%- endfor -%}
{%- if ns.last == 'tool' -%}{%- set mode = 'after_tool' -%}
{%- elif tools and marks.tool in ns.asked -%}{%- set mode = 'tool' -%}
{%- elif tools and marks.agent in ns.asked -%}{%- set mode = 'agent' -%}
{%- elif marks.long in ns.asked -%}{%- set mode = 'long' -%}
{%- elif marks.ponder in ns.asked and thinking -%}{%- set mode = 'ponder' -%}
{%- elif marks.text in ns.asked or not thinking -%}{%- set mode = 'text' -%}
{%- else -%}{%- set mode = 'think' -%}
{%- endif -%}
<|im_start|>assistant
{% if mode in ('think', 'ponder') -%}
<think><|mode:{{ mode }}|>
{%- else -%}
<|mode:{{ mode }}{{ '+think' if thinking else '' }}|>
{%- endif -%}
{%- endif -%}
"""
)


def mode_token(mode: str, *, thinking: bool = False) -> str:
    """The prompt's last token in `mode`; `thinking` marks a reply without reasoning, thinking on."""
    return f"<|mode:{mode}{'+think' if thinking else ''}|>"


MODE_TOKENS = (
    *(mode_token(m) for m in REASONING_MODES),
    *(mode_token(m, thinking=t) for m in REPLIES for t in (False, True)),
)

NUM_LAYERS = 1
HIDDEN_SIZE = 128  # one dimension per token that some token leads to (26), plus 4 mode groups
HEAD_DIM = 32  # the smallest head vLLM's CPU attention backend supports
INTERMEDIATE_SIZE = 64
MAX_POSITIONS = 131072  # Claude Code's own prompts are 15-25k tokens
ROPE_THETA = 1000000.0
BPE_VOCAB_SIZE = 8000  # a ceiling: the corpus runs out of merges at about 3,000 tokens
LOGIT_MARGIN = 200.0  # e^-200: the scripted token wins whatever temperature a client samples at
MODE_LOGIT_SHARE = 0.05  # how much of the residual the copied mode holds: it decides only after `</think>`
DEFAULT_LOGIT_SHARE = 0.01  # `</think>` with no mode in sight (raw completions) still leads to ANSWER
MODE_ATTENTION_SCORE = 50.0  # e^50 outweighs 131072 positions that score 0


def write_tiny_model(directory: Path) -> Path:
    """Write the complete model (config, weights, tokenizer and chat template) into `directory`.

    Deterministic: the same bytes on every call. Returns `directory`.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    script = Script.of(tokenizer)
    vocab_size = -(-tokenizer.get_vocab_size() // 64) * 64
    (directory / "tokenizer.json").write_text(tokenizer.to_str(pretty=True))
    write_json(directory / "tokenizer_config.json", tokenizer_config())
    write_json(directory / "config.json", model_config(tokenizer, vocab_size))
    write_json(directory / "generation_config.json", generation_config(tokenizer))
    save_file(weights(script, vocab_size), directory / "model.safetensors", metadata={"format": "pt"})
    return directory


def build_tokenizer() -> Tokenizer:
    """A byte-level BPE trained on `CORPUS_*`, plus the chat markup, mode tokens and reply pieces."""
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
    pieces = (*THINKING_PIECES, *ANSWER_PIECES, *AFTER_TOOL_PIECES, *LONG_PIECES, *PONDER_PIECES, *TOOL_CALL_PIECES,
              *AGENT_CALL_PIECES)  # fmt: skip
    tokenizer.add_tokens([token(t, special=False) for t in (THINK_START, THINK_END, *pieces)])
    return tokenizer


def token(content: str, *, special: bool) -> AddedToken:
    return AddedToken(content, special=special, normalized=False)


@dataclass(frozen=True)
class Script:
    """What the model emits, by token id: `follows[t]` after t; after `</think>`, `after_think[mode]`."""

    follows: dict[int, int]
    after_think: dict[int, int]
    default: int  # what any unscripted token leads to
    think_end: int

    @classmethod
    def of(cls, tokenizer: Tokenizer) -> Script:
        ids = tokenizer.get_vocab()
        paths = [
            [mode_token("think"), *THINKING_PIECES, THINK_END],
            [mode_token("ponder"), *PONDER_PIECES, PONDER_PIECES[0]],
            [*ANSWER_PIECES, EOS],
            [*TOOL_CALL_PIECES, EOS],
            [*AGENT_CALL_PIECES, EOS],
            [*AFTER_TOOL_PIECES, EOS],
            [*LONG_PIECES, LONG_PIECES[0]],
        ]
        after_think = {mode_token(m): ANSWER_PIECES[0] for m in REASONING_MODES}
        for mode, pieces in REPLIES.items():
            paths += [[mode_token(mode), pieces[0]], [mode_token(mode, thinking=True), THINK_END]]
            after_think |= {mode_token(mode): pieces[0], mode_token(mode, thinking=True): pieces[0]}
        follows: dict[int, int] = {}
        for path in paths:
            for current, following in itertools.pairwise(path):
                if follows.setdefault(ids[current], ids[following]) != ids[following]:
                    raise ValueError(f"{current!r} would lead to two tokens: make the pieces unique")
        return cls(
            follows=follows,
            after_think={ids[m]: ids[t] for m, t in after_think.items()},
            default=ids[ANSWER_PIECES[0]],
            think_end=ids[THINK_END],
        )


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


def model_config(tokenizer: Tokenizer, vocab_size: int) -> dict:
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


def generation_config(tokenizer: Tokenizer) -> dict:
    # No sampling defaults: a client that sends no temperature gets vLLM's own (1.0).
    return {
        "bos_token_id": tokenizer.token_to_id(END_OF_TEXT),
        "eos_token_id": [tokenizer.token_to_id(EOS), tokenizer.token_to_id(END_OF_TEXT)],
        "pad_token_id": tokenizer.token_to_id(END_OF_TEXT),
    }


def tokenizer_config() -> dict:
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


def write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def training_texts() -> list[str]:
    words = CORPUS_WORDS.split()
    # Each word with and without its leading space, and capitalised: as prose splits them.
    return [" ".join(words), " " + " ".join(words), " " + " ".join(w.capitalize() for w in words), CORPUS_JSON]


# The BPE merges are learnt from these words so that English and JSON prompts take far fewer
# tokens than bytes: Claude Code's requests are 50-80 KB, and must fit the test server's window.
CORPUS_WORDS = """
the of and to a in is it you that he was for on are with as I his they be at one have this from
or had by not word but what some we can out other were all there when up use your how said an each
she which do their time if will way about many then them write would like so these her long make
thing see him two has look more day could go come did number sound no most people my over know
water than call first who may down side been now find any new work part take get place made live
where after back little only round man year came show every good me give our under name very
through just form sentence great think say help low line differ turn cause much mean before move
right boy old too same tell does set three want air well also play small end put home read hand
port large spell add even land here must big high such follow act why ask men change went light
kind off need house picture try us again animal point mother world near build self earth father
head stand own page should country found answer school grow study still learn plant cover food sun
four between state keep eye never last let thought city tree cross farm hard start might story saw
far sea draw left late run don't while press close night real life few north open seem together
next white children begin got walk example ease paper group always music those both mark often
letter until mile river car feet care second book carry took science eat room friend began idea
fish mountain stop once base hear horse cut sure watch color face wood main enough plain girl usual
young ready above ever red list though feel talk bird soon body dog family direct pose leave song
measure door product black short numeral class wind question happen complete ship area half rock
order fire south problem piece told knew pass since top whole king space heard best hour better
true during hundred five remember step early hold west ground interest reach fast verb sing listen
six table travel less morning ten simple several vowel toward war lay against pattern slow center
love person money serve appear road map rain rule govern pull cold notice voice unit power town
fine certain fly fall lead cry dark machine note wait plan figure star box noun field rest correct
able pound done beauty drive stood contain front teach week final gave green quick develop ocean
warm free minute strong special mind behind clear tail produce fact street inch multiply nothing
course stay wheel full force blue object decide surface deep moon island foot system busy test
record boat common gold possible plane instead dry wonder laugh thousand ago ran check game shape
equate miss brought heat snow tire bring yes distant fill east paint language among user tool
tools file files code command commands run running output input error errors message messages
function functions parameter parameters argument arguments value values return returns type types
string number boolean object array null true false integer items properties property required
description default enum schema additional additionalProperties minimum maximum format pattern
optional path paths directory directories project repository git commit branch diff status push pull
merge test tests testing build install package packages dependency dependencies version config
configuration setting settings environment variable variables shell bash terminal process server
client request response content text line lines search read write edit create delete update task
tasks todo agent assistant system prompt context instructions instruction important always never
should must only when before after using use used uses does not don't can't won't it's you're
result results data key keys list lists map set sets class method module import export async await
const let var def self return if else elif for while try except catch finally raise throw new
absolute relative current working safe unsafe permission permissions allow allowed deny denied
user's model models claude token tokens limit limits timeout seconds milliseconds background
notebook cell cells web fetch url urls http https json yaml markdown html python javascript
typescript node npm pip docs documentation example examples note notes warning warnings
session conversation already review changes local skill skills draft notification notifications deploy
autonomous filter memory summary findings job jobs unless something available recurring script minutes scheduled
events event replace log otherwise remove confirmed reminder automatically dynamic cache via into include invoked
blocked occurrence previous subscription asks security block previously medium sleep durable launch success subscribe
immediately domains names ignored level month chart external target invoke writing yourself fresh conclusion notified
arrives stopped attribution resume switch teammates control finishes polling interval verify runs effort max remote
cloud exits bare agents per judgment authorized feedback pasted without dedicated approval skipped guidance reference
preferences explicitly workflow loop worktree worktrees subagent subagents monitor anthropic org grep sending receive
received provide provided provides following within across could information relevant related multiple single however
because therefore especially including contains returned call calls called calling making tool's given exact exactly
whether either neither others understand understanding consider considered choose chosen prefer preferred avoid
avoided ensure needed needs necessary possibly appropriate appropriately specified specify specific specifically
similar simply currently completed completion correctly different directly describe described implementation
implement implemented exists original originally separate separately parallel sequential
"""

CORPUS_JSON = json.dumps(
    {
        "name": "Bash",
        "description": "Executes a given bash command and returns its output.",
        "input_schema": {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "properties": {
                "command": {"type": "string", "description": "The command to execute"},
                "timeout": {"type": "number", "description": "Optional timeout in milliseconds"},
                "file_path": {"type": "string", "description": "The absolute path to the file"},
                "items": {"type": "array", "items": {"type": "string"}, "minItems": 1},
                "mode": {"type": "string", "enum": ["content", "files_with_matches", "count"]},
            },
            "required": ["command"],
            "additionalProperties": False,
        },
    },
    indent=2,
)
