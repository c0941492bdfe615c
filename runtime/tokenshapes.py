"""Credentials recognised by their own shape: private key blocks and the tokens of the services a pod or its
builder talks to. Standard library only: the log's redactor masks them (runtime.redact), and the build side
refuses a build context that holds one (space.context), so both read one list.
"""

from __future__ import annotations

import re

# Where a token may start: not inside a word, but right after an escape (`\n` in JSON-quoted prompts).
START = r"(?:(?<![A-Za-z0-9])|(?<=\\[nrt]))"


def shape(what: str, pattern: str) -> tuple[str, re.Pattern[str]]:
    return what, re.compile(pattern)


TOKEN_SHAPES: tuple[tuple[str, re.Pattern[str]], ...] = (
    # The whole block, log prefixes and escaped newlines included; to the end of the text when cut off.
    shape(
        "a private key",
        r"(?s)-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----.*?"
        r"(?:-----END (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----|\Z)",
    ),  # PEM, and PGP's private key blocks
    shape("a PuTTY private key", r"(?s)Private-Lines: \d+.*?(?:Private-MAC: [0-9a-fA-F]+|\Z)"),
    shape("a Hugging Face token", rf"{START}hf_[A-Za-z0-9]{{20,}}"),
    shape("an OpenAI or Anthropic key", rf"{START}sk-[A-Za-z0-9_-]{{16,}}"),  # sk-ant-…, sk-proj-…
    shape("a GitHub token", rf"{START}gh[pousr]_[A-Za-z0-9]{{30,}}"),
    shape("a GitHub token", rf"{START}github_pat_[A-Za-z0-9_]{{22,}}"),  # fine-grained
    shape("a RunPod API key", rf"{START}rpa_[A-Za-z0-9]{{20,}}"),
    shape("a Stripe key", rf"{START}[sr]k_(?:live|test)_[A-Za-z0-9]{{16,}}"),  # secret and restricted (pk_: public)
    shape("a Google API key", rf"{START}AIza[0-9A-Za-z_-]{{35}}"),
    shape("a Slack token", rf"{START}(?:xox[abprs]|xapp)-[A-Za-z0-9-]{{10,}}"),  # and app-level ones
    shape("a GitLab token", rf"{START}glpat-[A-Za-z0-9_-]{{20,}}"),
    shape("an npm token", rf"{START}npm_[A-Za-z0-9]{{36}}"),
    shape("a PyPI token", rf"{START}pypi-[A-Za-z0-9_-]{{50,}}"),
    shape("a Docker Hub token", rf"{START}dckr_pat_[A-Za-z0-9_-]{{20,}}"),
    shape("a webhook signing secret", rf"{START}whsec_[A-Za-z0-9+/=]{{20,}}"),  # Stripe, Svix
    shape("a SendGrid key", rf"{START}SG\.[A-Za-z0-9_-]{{16,}}\.[A-Za-z0-9_-]{{16,}}"),
    shape("a Google OAuth secret", rf"{START}GOCSPX-[A-Za-z0-9_-]{{20,}}"),
    shape("a Google OAuth token", rf"{START}ya29\.[A-Za-z0-9_-]{{20,}}"),
    shape("an AWS access key", rf"{START}(?:AKIA|ASIA)[0-9A-Z]{{16}}\b"),
    shape("a JWT", rf"{START}eyJ[A-Za-z0-9_-]{{8,}}\.eyJ[A-Za-z0-9_-]{{8,}}\.[A-Za-z0-9_-]*"),  # two JSON parts
    # Model providers a pod's user may hold keys of, and the services a team's tools talk to.
    shape("a Hugging Face organisation token", rf"{START}api_org_[A-Za-z0-9]{{30,}}"),
    shape("a Replicate token", rf"{START}r8_[A-Za-z0-9]{{30,}}"),
    shape("a Groq key", rf"{START}gsk_[A-Za-z0-9]{{40,}}"),
    shape("a Perplexity key", rf"{START}pplx-[A-Za-z0-9]{{40,}}"),
    shape("an xAI key", rf"{START}xai-[A-Za-z0-9]{{60,}}"),
    shape("a Fireworks key", rf"{START}fw_[A-Za-z0-9]{{20,}}"),
    shape("a Tavily key", rf"{START}tvly-[A-Za-z0-9_-]{{20,}}"),
    shape("a Together key", rf"{START}tgp_v1_[A-Za-z0-9_-]{{30,}}"),
    shape("a Telegram bot token", r"(?<!\d)\d{8,10}:AA[A-Za-z0-9_-]{33}"),  # in a URL too: /bot<token>/
    shape("a Twilio key", rf"{START}SK[0-9a-fA-F]{{32}}\b"),
    shape("a Mailgun key", rf"{START}key-[0-9a-f]{{32}}\b"),
    shape("a DigitalOcean token", rf"{START}do[opr]_v1_[a-f0-9]{{64}}"),
    shape("a Shopify token", rf"{START}shp(?:at|ss|ca|pa)_[a-fA-F0-9]{{32}}"),
    shape("an Atlassian token", rf"{START}ATATT3[A-Za-z0-9_=-]{{50,}}"),
    shape("a Linear key", rf"{START}lin_(?:api|oauth)_[A-Za-z0-9]{{40,}}"),
    shape("a Notion token", rf"{START}(?:ntn_[A-Za-z0-9]{{40,}}|secret_[A-Za-z0-9]{{43}}\b)"),
    shape("a Databricks token", rf"{START}dapi[0-9a-f]{{32}}"),
    shape("a Vault token", rf"{START}hv[sb]\.[A-Za-z0-9_-]{{24,}}"),
    shape("a Terraform Cloud token", rf"{START}[A-Za-z0-9]{{14}}\.atlasv1\.[A-Za-z0-9_-]{{60,}}"),
    shape("a GitLab token", rf"{START}gl(?:ptt|dt|rt|cbt|soat|ffct|imt|agent|oas)-[A-Za-z0-9_-]{{20,}}"),
    shape("a Bitbucket app password", rf"{START}ATBB[A-Za-z0-9]{{32}}"),
    shape("a base64'd Hugging Face token", rf"{START}aGZf[A-Za-z0-9+/]{{26,}}"),  # `hf_` in base64 starts `aGZf`
)

# Where a secret sits, whatever it looks like: (what, the head kept, the value). The redactor masks the value;
# the build context refuses a file where such a value is written out (not `${VAR}`, `<token>`, a marker).
SECRET_FIELD = (
    r"(?:(?:[A-Za-z0-9]+[_.-])*(?:access_token|refresh_token|token|password|passwd|passphrase|secret"
    r"|api[_-]?key|apikey|access_key|private_key|credentials?|creds|key[_-]data)"  # key-data: a kubeconfig's client key
    r"|(?:[A-Za-z0-9]+[_.-])+pwd)"  # `db_pwd`, never `PWD` alone (the shell's folder)
)
# The words that make a variable's name secret, as the last word (`DB_PASSWORD`, `GIT_PAT`, `AWS_CREDS`).
# Short words only after another (`PWD` alone is the shell's folder, `COMPAT` no token).
SECRET_NAME = (
    r"(?:(?:[A-Z][A-Z0-9]*_)+(?:PWD|PAT|PASS)"
    r"|[A-Z0-9_]*(?:PASSWORD|PASSWD|SECRET|TOKEN|API_?KEY|ACCESS_KEY|PRIVATE_KEY|CREDENTIALS?|CREDS))"
)
# A URL's `user:password@`: the user may be empty, the password hold `/` or `@` (the first `@` followed by a host
# ends it; at most 256 characters: linear on any text); `host:443/…` is a port.
URL_PASSWORD = re.compile(
    r"(?<=://)[^\s/:@]*:(?!\d+(?:[/?#\s]|\Z))\S{0,256}?@(?=[A-Za-z0-9.-]+(?::\d+)?(?:[/?#\s\"'<>]|\Z))"
)
PLACES: tuple[tuple[str, str, str], ...] = (
    ("an npm auth token", r"(?<![A-Za-z0-9])_auth(?:Token)?\s*=\s*", r"[^\s\"']+"),  # .npmrc
    ("a Docker registry auth", r"\"(?:auth|identitytoken)\"\s*:\s*\"", r"[^\"]+"),  # ~/.docker/config.json
    # A secret field as a line of YAML (`password: …`, a kubeconfig's `token: …`) or of an INI file (.pypirc).
    ("a secret field", rf"(?m:^)[ \t-]*{SECRET_FIELD}[ \t]*(?::[ \t]+|=[ \t]*)[\"']?", r"[^\s\"']{6,}"),
    ("a secret variable", rf"(?:^|(?<=[\s;]))(?:export[ \t]+)?{SECRET_NAME}=[\"']?", r"[^\s\"']{6,}"),
)
# A value that stands for a secret rather than holds one: a reference, a placeholder, a marker.
# Nor code that computes it (`os.environ[…]`, `settings.password`, `secret: bytes,`): a value must end its line.
PLACEHOLDER = re.compile(r"[$<{%\[*…]|(?i:(?:none|null|true|false|changeme|example|xxx+|\.\.\.)$)|.*[(\[`]|.*[,)]$")
CODE = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")  # a dotted name: an attribute, not a password
LINE_END = re.compile(r"[\"']?[ \t]*(?:[#;].*)?$", re.M)
PLACE_SHAPES = tuple((what, re.compile(f"(?i:{head})({value})")) for what, head, value in PLACES)


def written_out(pattern: re.Pattern[str], text: str) -> re.Match[str] | None:
    """The first match of a place's `pattern` whose value is written out (not a reference nor a placeholder)."""
    for match in pattern.finditer(text):
        value = match.group(1)
        if not PLACEHOLDER.match(value) and not CODE.fullmatch(value) and LINE_END.match(text, match.end()):
            return match
    return None


def first_credential(text: str) -> tuple[str, int] | None:
    """(what, line number) of the first credential in `text`, by its shape or by where it sits (a password in
    a URL, a secret field or variable written out); None when it holds none."""
    found = [(match.start(), what) for what, pattern in TOKEN_SHAPES if (match := pattern.search(text))]
    found += [(match.start(), what) for what, pattern in PLACE_SHAPES if (match := written_out(pattern, text))]
    if match := URL_PASSWORD.search(text):
        found.append((match.start(), "a password in a URL"))
    if not found:
        return None
    start, what = min(found)
    return what, text.count("\n", 0, start) + 1
