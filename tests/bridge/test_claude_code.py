"""The real Claude Code CLI (pinned in docker/versions.toml, installed under tests/.node by
scripts/setup), non-interactive, through the bridge to real vLLM: offline and deterministic."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import httpx

from runtime.engine import tinymodel as tiny
from tests.support.bridge import Process
from tests.support.claude_code import parse_result, require_claude_code, run_claude

# A 1x1 PNG: what a pasted screenshot sends, in small.
PNG = base64.b64encode(bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360000002000154a24f5d0000000049454e44ae426082"
)).decode()  # fmt: skip

require_claude_code()


def claude(
    bridge: Process, model: str, prompt: str, workdir: Path, home: Path, *options: str, environment: dict | None = None
) -> dict:
    """`claude -p PROMPT --output-format json` in `workdir`; its JSON result (exit code checked)."""
    done = run_claude(bridge, model, [prompt, "--output-format", "json", *options], workdir, home, environment)
    return parse_result(done)


def test_a_text_turn(bridge: Process, tmp_path: Path) -> None:
    (tmp_path / "home").mkdir()
    result = claude(bridge, "claude-tiny", f"Say hello {tiny.MARK_TEXT}", tmp_path, tmp_path / "home")
    assert result["result"] == tiny.ANSWER
    assert result["usage"]["input_tokens"] > 1000  # Claude Code's own system prompt and tools went through


def test_a_write_that_elides_the_file_is_held_back_and_claude_code_shows_why(bridge: Process, tmp_path: Path) -> None:
    """Real vLLM streams the tiny model's Write of an elided file; the guard puts its notice in the call's place:
    Claude Code writes nothing, ends the turn, and shows the user which write was held back and why."""
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir(), work.mkdir()
    result = claude(
        bridge, tiny.SERVED_NAME, f"Rewrite app.py {tiny.MARK_WRITE}", work, home, "--allowedTools", "Write"
    )
    assert result["result"].startswith("[vllm-pod guard] The write to app.py (Write) was blocked"), result["result"]
    assert f'"{tiny.WRITE_MARKER}"' in result["result"] and "Nothing was written" in result["result"]
    assert list(work.iterdir()) == [] and result["num_turns"] == 1


def test_a_tool_round_trip_runs_the_command(bridge: Process, tmp_path: Path) -> None:
    """The model calls Bash; Claude Code runs it (its side effect is on disk) and sends the result back."""
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir(), work.mkdir()
    result = claude(
        bridge, tiny.SERVED_NAME, f"Run the command {tiny.MARK_TOOL}", work, home, "--allowedTools", "Bash,Write"
    )
    assert (work / "proof.txt").read_text().strip() == "tiny-model-was-here"
    assert result["result"] == tiny.AFTER_TOOL and result["num_turns"] == 2


def test_a_session_that_starts_a_subagent(bridge: Process, tmp_path: Path) -> None:
    """The model calls the Agent tool; Claude Code runs the subagent (its own requests, its own agent id,
    hint headers on) through the bridge, hands its answer back, and the main agent ends the session."""
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir(), work.mkdir()
    arguments = [f"Ask a helper {tiny.MARK_AGENT}", "--output-format", "stream-json", "--verbose",
                 "--allowedTools", tiny.AGENT_TOOL]  # fmt: skip
    done = run_claude(bridge, tiny.SERVED_NAME, arguments, work, home, {"CLAUDE_CODE_GATEWAY_HINT_HEADERS": "1"})
    assert done.returncode == 0, f"claude exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-2000:]}"
    events = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    result = events[-1]
    assert result["type"] == "result" and result["is_error"] is False, result
    assert result["result"] == tiny.AFTER_TOOL and result["num_turns"] == 2
    assert result["subagent_stats"]["spawned"] == result["subagent_stats"]["completed"] == 1
    handed_back = [
        part["text"]
        for event in events if event["type"] == "user"
        for block in event["message"]["content"] if block["type"] == "tool_result"
        for part in block["content"]
    ]  # fmt: skip
    assert len(handed_back) == 1 and f"  {tiny.ANSWER}\n" in handed_back[0]  # the subagent's own answer
    # The bridge's console attributes each request: the main agent's two turns, the subagent's one.
    status = httpx.get(f"{bridge.url}/v1/pod/status", timeout=30).json()
    [session] = [session for session in status["sessions"] if session["id"] == result["session_id"]]
    main, helper = session["agents"]
    subagent_id = re.search(r"agentId: (\w+)", handed_back[0])
    assert subagent_id and (helper["agent"], helper["parent"]) == (subagent_id.group(1), "main")
    print(main["classes"], helper["classes"])  # what 2.1.332 said of each request, for the record (-s)
    assert (main["agent"], main["parent"], main["classes"]) == ("main", None, {"main": 2, "1p:main": 2})
    assert helper["classes"] == {"subagent": 1, "1p:blocking-subagent": 1} and helper["output_tokens"] > 0
    told = result["usage"], result["modelUsage"][tiny.SERVED_NAME]  # the main agent's; the session's
    assert (main["input_tokens"], main["cached_tokens"]) == (
        told[0]["input_tokens"],
        told[0]["cache_read_input_tokens"],
    )
    assert main["input_tokens"] + helper["input_tokens"] == told[1]["inputTokens"]


def test_claude_code_discovers_the_served_model(bridge: Process, tmp_path: Path) -> None:
    """With CLAUDE_CODE_ENABLE_GATEWAY_MODEL_DISCOVERY=1 Claude Code asks `/v1/models` at start and adds
    the ids that name claude to its `/model` picker (its cache file is that list)."""
    home = tmp_path / "home"
    home.mkdir()
    discovery = {"CLAUDE_CODE_ENABLE_GATEWAY_MODEL_DISCOVERY": "1"}
    claude(bridge, tiny.SERVED_NAME, f"Say hello {tiny.MARK_TEXT}", tmp_path, home, environment=discovery)
    cached = json.loads((home / ".claude" / "cache" / "gateway-models.json").read_text())
    assert cached["baseUrl"] == bridge.url
    assert [model["id"] for model in cached["models"]] == ["claude-tiny"]  # the session bridge's aliases name no claude
    assert cached["models"][0]["description"].startswith(f"{tiny.SERVED_NAME} on this pod's vLLM")


def test_an_image_the_text_only_model_cannot_take_is_dropped_by_claude_code_and_the_turn_completes(
    bridge: Process, tmp_path: Path
) -> None:
    """Claude Code's gateway contract: `capability_rejected: image_block` makes the client strip the image and
    retry once. A user message with an image (what a paste sends) to the tiny text-only model: vLLM refuses the
    image, the bridge says so in the contract's words, and the turn completes with the model's answer."""
    home = tmp_path / "home"
    home.mkdir()
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}}
    said = {"type": "user", "message": {"role": "user", "content": [
        {"type": "text", "text": f"Say hello {tiny.MARK_TEXT}"}, image]}}  # fmt: skip
    before = bridge.log()
    arguments = ["--input-format", "stream-json", "--output-format", "stream-json", "--verbose"]
    done = run_claude(bridge, tiny.SERVED_NAME, arguments, tmp_path, home, said=json.dumps(said) + "\n")
    assert done.returncode == 0, f"claude exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-2000:]}"
    events = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    [removed] = [event for event in events if event.get("api_error") == "media_removed"]
    print(json.dumps(removed, indent=1))  # what the CLI said of it, for the record (-s)
    assert removed["api_error_params"] == {"media": "image", "media_reason": "unprocessable"}
    assert "an image in the conversation could not be processed and was removed" in json.dumps(removed["message"])
    result = events[-1]
    assert result["type"] == "result" and result["is_error"] is False, result
    assert result["result"] == tiny.ANSWER
    # The bridge saw the refused request, then the same session's retry without the image.
    traces = [line for line in bridge.log()[len(before) :].splitlines() if f"session={result['session_id']}" in line]
    assert [re.search(r"POST /v1/messages (\d+) ", line)[1] for line in traces] == ["400", "200"], traces
