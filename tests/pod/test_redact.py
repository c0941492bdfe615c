"""Redaction: secrets are masked before anything leaves the pod; ordinary settings and log text are left alone."""

from __future__ import annotations

import base64

import pytest

from runtime.redact import MARKER, Redactor
from runtime.settings import is_secret

HF = "hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYz01234567"


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("HF_TOKEN", True),
        ("VL_API_KEYS", True),
        ("GITHUB_TOKEN", True),
        ("ANTHROPIC_AUTH_TOKEN", True),
        ("OPENAI_API_KEY", True),
        ("AWS_SECRET_ACCESS_KEY", True),
        ("DB_PASSWORD", True),
        ("MYSQL_PASSWD", True),
        ("SMTP_PASS", True),
        ("GOOGLE_APPLICATION_CREDENTIALS", True),
        ("HFTOKEN", True),  # glued spelling
        ("openaiApiKey", True),  # camel case, as some tools write it
        ("VL_KVBYTES", False),  # "KV" is not "KEY"
        ("VL_KV", False),
        ("TOKENIZERS_PARALLELISM", False),
        ("VL_MAX_TOKENS", False),  # a count, not a token
        ("KEYBOARD_LAYOUT", False),
        ("MONKEY_PATCH", False),
        ("PUBLIC_KEY", False),  # RunPod's SSH public key is meant to be seen
        ("SSH_PUBLIC_KEY", False),
        ("PWD", False),  # the shell's working directory
        ("PATH", False),
        ("VL_SPEC", False),
        ("RUNPOD_POD_ID", False),
        ("VL_API_KEYS", True),  # a setting: as its row in runtime/settings.py says
        ("VL_SSH_HOST_KEYS", False),  # a path, not keys
        ("VL_KEY_CONCURRENCY", False),
    ],
)
def test_which_names_look_secret(name: str, secret: bool) -> None:
    assert is_secret(name) is secret


ENV = {
    "HF_TOKEN": HF,
    "VL_API_KEYS": "team-key-one, team-key-two, alice:alice-key-0123",  # `name:key`: the key alone is accepted
    "DB_PASSWORD": "correct horse battery",
    "HF_HUB_DISABLE_IMPLICIT_TOKEN": "1",  # secret-looking name, harmless value: must not mask every "1"
    "VL_KVBYTES": "8589934592",
    "PUBLIC_KEY": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPublicPublicPublic user@laptop",
}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (f"HF_TOKEN={HF}", f"HF_TOKEN={MARKER}"),
        ("keys: team-key-one,team-key-two", f"keys: {MARKER},{MARKER}"),
        ("login with correct horse battery now", f"login with {MARKER} now"),
        ("kv cache 8589934592 bytes, 1 GPU, step 1", "kv cache 8589934592 bytes, 1 GPU, step 1"),
        (
            "authorized key ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPublicPublicPublic user@laptop",
            "authorized key ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPublicPublicPublic user@laptop",
        ),
        # shapes, whoever the variable was
        ("token hf_ZyXwVuTsRqPoNmLkJiHgFeDcBa9876543210 leaked", f"token {MARKER} leaked"),
        ("OPENAI_API_KEY=sk-proj-abcdefghijklmnop0123", f"OPENAI_API_KEY={MARKER}"),
        ("x sk-ant-api03-abcdefghijklmnopqrstu y", f"x {MARKER} y"),
        ("Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.payload.sig", f"Authorization: Bearer {MARKER}"),
        ("curl -H 'Authorization: Basic dXNlcjpwYXNzd29yZA=='", f"curl -H 'Authorization: Basic {MARKER}'"),
        ("headers {'x-api-key': 'abcdef123456'}", f"headers {{'x-api-key': '{MARKER}'}}"),
        ("vllm serve m --api-key abcdef123456 --port 1", f"vllm serve m --api-key {MARKER} --port 1"),
        ("non-default args: {'api_key': ['abcdef123456']}", f"non-default args: {{'api_key': ['{MARKER}']}}"),
        ("cloning https://user:s3cretpass@example.com/repo.git", f"cloning https://{MARKER}@example.com/repo.git"),
        ("ghp_abcdefghijklmnopqrstuvwxyz0123456789 AKIAABCDEFGHIJKLMNOP", f"{MARKER} {MARKER}"),
        # ordinary log text stays readable
        (
            "INFO Loading weights took 31.2 s; max_num_batched_tokens=8192",
            "INFO Loading weights took 31.2 s; max_num_batched_tokens=8192",
        ),
        (
            "using basic attention, a bearer of news, task-1234567890abcdefghij",
            "using basic attention, a bearer of news, task-1234567890abcdefghij",
        ),
        (
            "self.hf_config_path=/models/qwen tokenizer token count 12",
            "self.hf_config_path=/models/qwen tokenizer token count 12",
        ),
    ],
)
def test_redaction(text: str, expected: str) -> None:
    assert Redactor.from_environ(ENV)(text) == expected


def test_a_secret_containing_another_is_masked_whole() -> None:
    redact = Redactor(["abcdef", "abcdef-longer-secret"])
    assert redact("x abcdef-longer-secret y abcdef") == f"x {MARKER} y {MARKER}"


def test_a_blank_value_is_no_secret() -> None:
    """`RUNPOD_API_KEY=" "` (a key left blank) masked every space of `pod`'s error lines."""
    assert Redactor([" ", "\t", ""])("RUNPOD_API_KEY is empty: set it") == "RUNPOD_API_KEY is empty: set it"


def test_learning_secrets_from_the_hub_file() -> None:
    redact = Redactor.from_environ({})
    assert redact("key remote-key-123") == "key remote-key-123"
    redact.learn({"VL_API_KEYS": "remote-key-123", "VL_CTX": "65536"})
    assert redact("key remote-key-123, ctx 65536") == f"key {MARKER}, ctx 65536"


# Test secrets: fake, yet shaped like the real ones (prefix, alphabet, length).
PEM = (
    "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW\n"
    "QyNTUxOQAAACBGQUtFLUtFWS1GT1ItVEVTVFMtT05MWS1GQUtFLUtFWQAAAJgAAAAAAAAA\n-----END OPENSSH PRIVATE KEY-----"
)
JWT = (
    "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiJmYWtlLXVzZXIiLCJpYXQiOjB9.ZmFrZS1zaWduYXR1cmUtZm9yLXRlc3RzLW9ubHk"
)
GITHUB_PAT = "github_pat_11FAKE0TESTS0ONLY00000_abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ012345678"
GHP = "ghp_FAKE0TEST0ONLY0abcdefghijklmnopqrstu"
PGP = "-----BEGIN PGP PRIVATE KEY BLOCK-----\n\nlQOYBGFAKEFAKEFAKEtestsonly\n=AbCd\n-----END PGP PRIVATE KEY BLOCK-----"
PPK = ("PuTTY-User-Key-File-3: ssh-ed25519\nEncryption: none\nComment: laptop\nPublic-Lines: 1\n"
       "AAAAC3NzaC1lZDI1NTE5AAAAIPublicPublicPublic\nPrivate-Lines: 1\nAAAAIFAKEprivateFAKEprivateFAKE\n"
       "Private-MAC: 0123456789abcdef0123456789abcdef")  # fmt: skip
BASIC = base64.b64encode(b"alice:team-key-two").decode()  # a key of the pod's own, in a Basic credential
SECRET_SHAPES = [
    ("name:key entry, bare key", "401 for key alice-key-0123 (label alice)", f"401 for key {MARKER} (label alice)"),
    ("PEM block", f"boot | key:\n{PEM}\nboot | sshd started", f"boot | key:\n{MARKER}\nboot | sshd started"),
    ("PEM block, log-prefixed lines", "boot | " + PEM.replace("\n", "\nboot | ") + "\nboot | next",
     f"boot | {MARKER}\nboot | next"),
    ("PEM block, escaped in JSON", '{"key": "' + PEM.replace("\n", "\\n") + '", "user": "root"}',
     f'{{"key": "{MARKER}", "user": "root"}}'),
    ("PEM block cut off by the tail", f"engine | {PEM[:90]}", f"engine | {MARKER}"),
    ("RunPod key", "runpod: using key rpa_FAKE0KEY0FOR0TESTS0ONLY0ABCDEFGHIJKL (env)", f"runpod: using key {MARKER} (env)"),
    ("GitHub fine-grained token", f"git push with {GITHUB_PAT} failed", f"git push with {MARKER} failed"),
    ("GitHub classic token after an escaped newline", f"prompt='use this:\\n{GHP} thanks'",
     f"prompt='use this:\\n{MARKER} thanks'"),
    ("Stripe live key", "charge with sk_live_FAKE0stripe0key0TESTS0ONLY ok", f"charge with {MARKER} ok"),
    ("Stripe test key", "stripe.api_key set: sk_test_FAKE0stripe0key0TESTS0ONLY", f"stripe.api_key set: {MARKER}"),
    ("Google API key", "maps?client=AIzaSyD-FAKE0KEY0FOR0TESTS0ONLY0abcdefg&x=1", f"maps?client={MARKER}&x=1"),
    ("Slack token", "slack: xoxb-000000000000-0000000000000-FAKEfakeFAKEfakeFAKEfake posted",
     f"slack: {MARKER} posted"),
    ("bare JWT", f"session {JWT} expired", f"session {MARKER} expired"),
    ("?token= in a URL", "GET https://example.com/dl?token=FAKE0token0value&part=2 200",
     f"GET https://example.com/dl?token={MARKER}&part=2 200"),
    ("?access_token= in a URL", "https://example.com/api?access_token=FAKE0access0token",
     f"https://example.com/api?access_token={MARKER}"),
    ("?key= in a URL", 'fetch "https://example.com/v1/models?key=FAKE0key0value" failed',
     f'fetch "https://example.com/v1/models?key={MARKER}" failed'),
    ("&api_key= in a URL", "https://example.com/q?model=x&api_key=FAKE0api0key#top",
     f"https://example.com/q?model=x&api_key={MARKER}#top"),
    ('JSON "password"', '{"user": "alice", "password": "FAKE correct horse", "port": 5432}',
     f'{{"user": "alice", "password": "{MARKER}", "port": 5432}}'),
    ('JSON "token"', '{"token": "FAKE0token\\"quoted\\"0value", "expires": 3600}',
     f'{{"token": "{MARKER}", "expires": 3600}}'),
    ('JSON "secret"', '{"client_id": "app", "client_secret": "FAKE0secret0value"}',
     f'{{"client_id": "app", "client_secret": "{MARKER}"}}'),
    ('JSON "api_key"', '{"openai_api_key": "FAKE0api0key0value", "model": "x"}',
     f'{{"openai_api_key": "{MARKER}", "model": "x"}}'),
    ("Cookie header", 'curl -H "Cookie: sessionid=FAKE0session; csrftoken=FAKE0csrf" https://example.com/',
     f'curl -H "Cookie: {MARKER}" https://example.com/'),
    ("Set-Cookie header", "< Set-Cookie: session=FAKE0session0value; Path=/; HttpOnly\n< Vary: Accept",
     f"< Set-Cookie: {MARKER}\n< Vary: Accept"),
    ("URL credentials, empty user", "cloning https://:FAKE0pass0word@example.com/repo.git",
     f"cloning https://{MARKER}@example.com/repo.git"),
    ("URL credentials, / in the password", "db postgres://app:FAKE/pass0word@db.example.com:5432/app up",
     f"db postgres://{MARKER}@db.example.com:5432/app up"),
    ("URL credentials, @ in the password", "proxy http://alice:FAKE@pass0word@proxy.example.com:3128 set",
     f"proxy http://{MARKER}@proxy.example.com:3128 set"),
    ("another service's *_API_KEY", "env: MISTRAL_API_KEY=FAKE0mistral0key0123 LANG=C.UTF-8",
     f"env: MISTRAL_API_KEY={MARKER} LANG=C.UTF-8"),
    ("short Bearer", "curl -H 'Authorization: Bearer t0k3n' http://127.0.0.1:8080/v1/models",
     f"curl -H 'Authorization: Bearer {MARKER}' http://127.0.0.1:8080/v1/models"),
    ("short x-api-key", "headers={'x-api-key': 'k-42', 'anthropic-version': '2023-06-01'}",
     f"headers={{'x-api-key': '{MARKER}', 'anthropic-version': '2023-06-01'}}"),
    ("GitLab token", "git clone with glpat-FAKE0gitlab0TESTS0only0x ok", f"git clone with {MARKER} ok"),
    ("npm token", "//npm.example.test/:_authToken=npm_FAKE0npm0token0TESTS0only0ABCDEFGHIJ x",
     f"//npm.example.test/:_authToken={MARKER} x"),
    ("PyPI token", "upload with pypi-AgEIcHlwaS5vcmcFAKE0pypi0token0FOR0TESTS0ONLY0abcdefghijkl done",
     f"upload with {MARKER} done"),
    ("Docker Hub token", "login: dckr_pat_FAKE0docker0TESTS0only0x", f"login: {MARKER}"),
    ("webhook secret", "signing with whsec_FAKE0webhook0TESTS0only0xyz", f"signing with {MARKER}"),
    ("SendGrid key", "mail via SG.FAKE0sendgrid0key.FAKE0TESTS0ONLY0abcdef sent", f"mail via {MARKER} sent"),
    ("Slack app token", "socket mode xapp-1-FAKE0SLACK0APP0tests up", f"socket mode {MARKER} up"),
    ("Google OAuth client secret", "client GOCSPX-FAKE0google0TESTS0only0x", f"client {MARKER}"),
    ("Google OAuth access token", "token ya29.FAKE0google0access0TESTS0only end", f"token {MARKER} end"),
    ("PGP private key block", f"gpg import:\n{PGP}\ndone", f"gpg import:\n{MARKER}\ndone"),
    ("PuTTY private key", PPK, PPK.split("Private-Lines")[0] + MARKER),
    ("AWS credentials file", "[default]\naws_access_key_id = AKIAFAKE0TESTS0ONLY\naws_secret_access_key = FAKE/secret+KEY0x",
     f"[default]\naws_access_key_id = AKIAFAKE0TESTS0ONLY\naws_secret_access_key = {MARKER}"),
    ("Azure connection string", "DefaultEndpointsProtocol=https;AccountName=app;AccountKey=FAKE0azure0key==;EndpointSuffix=x",
     f"DefaultEndpointsProtocol=https;AccountName=app;AccountKey={MARKER};EndpointSuffix=x"),
    ("Slack webhook", "POST https://hooks.slack.com/services/T0FAKE/B0FAKE/FAKE0tests0only 200",
     f"POST https://hooks.slack.com/services/{MARKER} 200"),
    ("Discord webhook", "POST https://discord.com/api/webhooks/123456/FAKE0tests0only-x 204",
     f"POST https://discord.com/api/webhooks/{MARKER} 204"),
    ("?auth= in a URL", "wss://example.test/feed?auth=FAKE0auth0value&v=2", f"wss://example.test/feed?auth={MARKER}&v=2"),
    ("X-Auth-Token header", "curl -H 'X-Auth-Token: t0k' https://example.test/", f"curl -H 'X-Auth-Token: {MARKER}' https://example.test/"),
    ("curl -u", "curl -u alice:FAKE0pass0word https://example.test/", f"curl -u alice:{MARKER} https://example.test/"),
    ("--password on a command line", "mysql --password FAKE0pw0x -h db", f"mysql --password {MARKER} -h db"),
    ("--password=", "tool --password=FAKE0pw0x --verbose", f"tool --password={MARKER} --verbose"),
    ("YAML password", "db:\n  user: app\n  password: FAKE0yaml0pw\n  port: 5432",
     f"db:\n  user: app\n  password: {MARKER}\n  port: 5432"),
    ("the pod's key in base64", f"auth: {BASIC}", f"auth: {BASIC[:8]}{MARKER}"),  # `alice:` encoded stays: no secret
    ("a Docker config's auth, whole", f"docker config: {{\"auth\": \"{BASIC}\"}}",
     f"docker config: {{\"auth\": \"{MARKER}\"}}"),
]  # fmt: skip
NOT_SECRETS = [
    ("PUBLIC_KEY is public by design", "PUBLIC_KEY=ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPublicPublicPublic user@laptop"),
    ("SSH_PUBLIC_KEY too", "SSH_PUBLIC_KEY=ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPublicPublicPublic user@laptop"),
    ("a PEM public key",
     "-----BEGIN PUBLIC KEY-----\nMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEPublicPublicPublic==\n-----END PUBLIC KEY-----"),
    ("VL_KVBYTES", "VL_KVBYTES=8589934592 VL_KV=fp8"),
    ("a harmless value under a secret-looking name", "HF_HUB_DISABLE_IMPLICIT_TOKEN=1 HF_HUB_OFFLINE=1"),
    ("tokenizers' warning", "huggingface/tokenizers: The current process just got forked, after parallelism has already "
     "been used. Disabling parallelism to avoid deadlocks...\n\t- Explicitly set the environment variable "
     "TOKENIZERS_PARALLELISM=(true | false)"),
    ("token counts in JSON", '{"max_tokens": 1024, "token_count": 12, "tokenizer": "qwen", "keys": 3}'),
    ("vLLM's arguments without a key", "args: Namespace(host='127.0.0.1', api_key=None, max_num_seqs=8)"),
    ("a plain URL", "Downloading https://huggingface.co/nvidia/model/resolve/main/config.json?download=true 200"),
    ("a port, then a scoped package", "GET https://packages.example.test:443/@anthropic-ai/claude-code 200"),
    ("an e-mail address", "committed by alice@example.com"),
    ("YAML that holds no secret", "model:\n  max_tokens: 4096\n  token_budget: 10\n  keys: 3"),
    ("an INI line that holds no secret", "[engine]\nmax_model_len = 65536\ntokenizer = auto"),
    ("a user option without a password", "ssh -u alice host; curl -u alice https://example.test/"),
]  # fmt: skip


FAKE_HEX = ("0fa4e1b2c3d4" * 20)[:64]
FAKE = ("FAKE0tests0only0" * 8)[:90]  # made up here: no real credential in the repo
# The fourth round's corpus: what a published line can carry that slipped through (28 of these 43 did), each
# with the part that must go. Tokens of the services a pod or a team's tools talk to, and the places a secret
# sits in (a form body, a Docker or npm or kube config, a DSN, a mysql command line).
SERVICE_AND_PLACE = [
    ("HF organisation token", f"push with api_org_{FAKE[:34]} ok", f"api_org_{FAKE[:34]}"),
    ("Replicate", f"run r8_{FAKE[:37]} ok", f"r8_{FAKE[:37]}"),
    ("Groq", f"client gsk_{FAKE[:52]} ok", f"gsk_{FAKE[:52]}"),
    ("Perplexity", f"key pplx-{FAKE_HEX[:48]} ok", f"pplx-{FAKE_HEX[:48]}"),
    ("xAI", f"key xai-{FAKE[:80]} ok", f"xai-{FAKE[:80]}"),
    ("Fireworks", f"key fw_{FAKE[:24]} ok", f"fw_{FAKE[:24]}"),
    ("Tavily", f"key tvly-{FAKE[:32]} ok", f"tvly-{FAKE[:32]}"),
    ("Together", f"key tgp_v1_{FAKE[:43]} ok", f"tgp_v1_{FAKE[:43]}"),
    ("Telegram bot in a URL", f"GET https://api.telegram.org/bot123456789:AA{FAKE[:33]}/getMe 200", f"AA{FAKE[:33]}"),
    ("Twilio", f"twilio SK{FAKE_HEX[:32]} ok", f"SK{FAKE_HEX[:32]}"),
    ("Mailgun", f"mail key-{FAKE_HEX[:32]} ok", f"key-{FAKE_HEX[:32]}"),
    ("DigitalOcean", f"doctl dop_v1_{FAKE_HEX} ok", FAKE_HEX),
    ("Shopify", f"shop shpat_{FAKE_HEX[:32]} ok", f"shpat_{FAKE_HEX[:32]}"),
    ("Atlassian", f"jira ATATT3x{FAKE[:60]} ok", f"ATATT3x{FAKE[:60]}"),
    ("Linear", f"linear lin_api_{FAKE[:40]} ok", f"lin_api_{FAKE[:40]}"),
    ("Notion", f"notion ntn_{FAKE[:46]} ok", f"ntn_{FAKE[:46]}"),
    ("Notion, legacy", f"notion secret_{FAKE[:43]} ok", f"secret_{FAKE[:43]}"),
    ("Databricks", f"dbx dapi{FAKE_HEX[:32]} ok", f"dapi{FAKE_HEX[:32]}"),
    ("Vault", f"vault hvs.{FAKE[:90]} ok", f"hvs.{FAKE[:90]}"),
    ("Terraform Cloud", f"tfc abcdefghijklmn.atlasv1.{FAKE[:70]} ok", f"atlasv1.{FAKE[:70]}"),
    ("GitLab pipeline trigger", f"gitlab glptt-{FAKE[:40]} ok", f"glptt-{FAKE[:40]}"),
    ("GitLab runner", f"gitlab glrt-{FAKE[:20]} ok", f"glrt-{FAKE[:20]}"),
    ("Bitbucket app password", f"bb ATBB{FAKE[:32]} ok", f"ATBB{FAKE[:32]}"),
    ("a form body's first field", "body: password=FAKE0pw0value&username=alice", "FAKE0pw0value"),
    ("a Docker config's auth", '{"auths": {"ghcr.io": {"auth": "YWxpY2U6RkFLRTBwYXNzd29yZA=="}}}', "YWxpY2U6"),
    ("a kubeconfig's client key", "  user:\n    client-key-data: LS0tFAKE0key0data0base64==\n", "LS0tFAKE"),
    ("npm's legacy authToken", "//registry.example.test/:_authToken=00000000-fake-0000-test-000000000000", "0000-fake"),
    ("mysql -p", "mysql -uroot -pFAKE0my0pw0x db", "FAKE0my0pw0x"),
    ("a Sentry DSN's key", f"SENTRY_DSN=https://{FAKE_HEX[:32]}@o1.ingest.sentry.io/1", FAKE_HEX[:32]),
]  # fmt: skip
LOOK_ALIKES = [  # what the new rules must leave readable
    "mkdir -p build && ssh -p 2222 host && docker run -p 8080:80 image",
    "trace id=msg_1 POST /v1/messages 200 key=alice max_tokens=1024 prompt_tokens=12",
    "git clone git@github.com:acme/vllm-pod.git; open https://alice@example.com/",
    "secret_santa_list_for_the_team_party_2026_x = load()",
    "mysql -h db -P 3306 -u app --skip-password < dump.sql",
    "2026-12-04T06:00:00 1733300000:AAx short",
]


@pytest.mark.parametrize(("text", "secret"), [(t, s) for _, t, s in SERVICE_AND_PLACE],
                         ids=[c for c, _, _ in SERVICE_AND_PLACE])  # fmt: skip
def test_the_fourth_round_s_corpus_leaves_nothing(text: str, secret: str) -> None:
    redacted = Redactor()(text)
    assert secret not in redacted and MARKER in redacted, redacted


@pytest.mark.parametrize("text", LOOK_ALIKES)
def test_the_fourth_round_s_rules_leave_look_alikes_readable(text: str) -> None:
    assert Redactor()(text) == text


@pytest.mark.parametrize(
    ("text", "expected"), [(t, e) for _, t, e in SECRET_SHAPES], ids=[c for c, _, _ in SECRET_SHAPES]
)
def test_secret_shapes_are_masked_and_the_rest_stays(text: str, expected: str) -> None:
    assert Redactor.from_environ(ENV)(text) == expected


@pytest.mark.parametrize("text", [t for _, t in NOT_SECRETS], ids=[c for c, _ in NOT_SECRETS])
def test_what_is_not_a_secret_stays_readable(text: str) -> None:
    assert Redactor.from_environ(ENV)(text) == text


# The fifth round's corpus (issue 46): what the earlier corpora's leaks had in common, each with the part that
# must go. Header tuples as Python prints them, short values after an auth header's name, a known value
# URL-encoded or JSON-escaped, and the names `*_PWD`, `*_PAT`, `CREDS` hold secrets under.
KNOWN = {"VL_API_KEYS": "team/key+one two", "HF_TOKEN": 'hf"quoted\\key'}
FIFTH_ROUND = [
    ("header tuple", "headers=[('x-api-key', 'k-42'), ('accept', '*/*')]", "k-42"),
    ("header tuple, bytes", "raw=[(b'authorization', b'Bearer t0k')]", "t0k"),
    ("header tuple, Authorization", "[('Authorization', 'Basic dTpw')]", "dTpw"),
    ("header tuple, double quotes", '[("X-Auth-Token", "t0k3")]', "t0k3"),
    ("header tuple, api-key", "(('api-key', 'az-1'),)", "az-1"),
    ("short Bearer after the header's name", "authorization: bearer ab1", "ab1"),
    ("short sk- after x-api-key", "x-api-key=sk-1", "sk-1"),
    ("short sk- after the header, JSON", '{"x-api-key": "sk-ab"}', "sk-ab"),
    ("short Bearer, JSON", '{"Authorization": "Bearer zz9"}', "zz9"),
    ("a known value, URL-encoded", "GET /x?k=team%2Fkey%2Bone%20two 401", "team%2Fkey%2Bone%20two"),
    ("a known value, form-encoded", "body: k=team%2Fkey%2Bone+two", "team%2Fkey%2Bone+two"),
    ("a known value, JSON-escaped", '{"prompt": "use hf\\"quoted\\\\key"}', 'hf\\"quoted\\\\key'),
    ("*_PWD", "env: DB_PWD=FAKE0pwd0value LANG=C", "FAKE0pwd0value"),
    ("*_PAT", "env: GIT_PAT=FAKE0pat0value LANG=C", "FAKE0pat0value"),
    ("CREDS", "env: CREDS=FAKE0creds0value LANG=C", "FAKE0creds0value"),
    ("*_CREDS", "env: AWS_CREDS=FAKE0creds0value", "FAKE0creds0value"),
    ("*_PWD in YAML", "db:\n  db_pwd: FAKE0pwd0value\n", "FAKE0pwd0value"),
]
FIFTH_ROUND_LOOK_ALIKES = [
    "PWD=/home/alice COMPAT=legacy0mode PATH=/usr/bin",
    "headers=[('accept', '*/*'), ('content-type', 'application/json')]",
    '{"prompt": "a team key of one"}',
]


@pytest.mark.parametrize(("text", "secret"), [(t, s) for _, t, s in FIFTH_ROUND], ids=[c for c, _, _ in FIFTH_ROUND])
def test_the_fifth_round_s_corpus_leaves_nothing(text: str, secret: str) -> None:
    redacted = Redactor.from_environ(KNOWN)(text)
    assert secret not in redacted and MARKER in redacted, redacted


@pytest.mark.parametrize("text", FIFTH_ROUND_LOOK_ALIKES)
def test_the_fifth_round_s_rules_leave_look_alikes_readable(text: str) -> None:
    assert Redactor.from_environ(KNOWN)(text) == text
