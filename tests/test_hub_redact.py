"""Redaction: secrets are masked before anything leaves the pod; ordinary settings and log text are left alone."""

from __future__ import annotations

import pytest

from runtime.hub.redact import MARKER, Redactor, name_looks_secret

HF = "hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYz01234567"


@pytest.mark.parametrize(("name", "secret"), [
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
])
def test_which_names_look_secret(name: str, secret: bool) -> None:
    assert name_looks_secret(name) is secret


ENV = {
    "HF_TOKEN": HF,
    "VL_API_KEYS": "team-key-one, team-key-two",
    "DB_PASSWORD": "correct horse battery",
    "HF_HUB_DISABLE_IMPLICIT_TOKEN": "1",  # secret-looking name, harmless value: must not mask every "1"
    "VL_KVBYTES": "8589934592",
    "PUBLIC_KEY": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPublicPublicPublic user@laptop",
}


@pytest.mark.parametrize(("text", "expected"), [
    (f"HF_TOKEN={HF}", f"HF_TOKEN={MARKER}"),
    ("keys: team-key-one,team-key-two", f"keys: {MARKER},{MARKER}"),
    ("login with correct horse battery now", f"login with {MARKER} now"),
    ("kv cache 8589934592 bytes, 1 GPU, step 1", "kv cache 8589934592 bytes, 1 GPU, step 1"),
    ("authorized key ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPublicPublicPublic user@laptop",
     "authorized key ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPublicPublicPublic user@laptop"),
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
    ("INFO Loading weights took 31.2 s; max_num_batched_tokens=8192",
     "INFO Loading weights took 31.2 s; max_num_batched_tokens=8192"),
    ("using basic attention, a bearer of news, task-1234567890abcdefghij",
     "using basic attention, a bearer of news, task-1234567890abcdefghij"),
    ("self.hf_config_path=/models/qwen tokenizer token count 12",
     "self.hf_config_path=/models/qwen tokenizer token count 12"),
])
def test_redaction(text: str, expected: str) -> None:
    assert Redactor.from_environ(ENV)(text) == expected


def test_a_secret_containing_another_is_masked_whole() -> None:
    redact = Redactor(["abcdef", "abcdef-longer-secret"])
    assert redact("x abcdef-longer-secret y abcdef") == f"x {MARKER} y {MARKER}"


def test_learning_secrets_from_the_hub_file() -> None:
    redact = Redactor.from_environ({})
    assert redact("key remote-key-123") == "key remote-key-123"
    redact.learn({"VL_API_KEYS": "remote-key-123", "VL_CTX": "65536"})
    assert redact("key remote-key-123, ctx 65536") == f"key {MARKER}, ctx 65536"
