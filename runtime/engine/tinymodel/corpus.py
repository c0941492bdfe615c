"""What the tiny model's BPE vocabulary is learnt from: common English words, the words of Claude Code's prompts and
a tool's JSON schema, so that prompts take few tokens. Standard library only."""

from __future__ import annotations

import json


def training_texts() -> list[str]:
    """The texts the tokenizer's BPE is trained on."""
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
