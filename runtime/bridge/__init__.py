"""The bridge: Anthropic's Messages API (what Claude Code speaks) in front of vLLM's OpenAI API.

`python -m runtime bridge --upstream URL` serves it; `runtime.bridge.app.create_app` builds it around the shared state of `runtime.bridge.state.Bridge`.
"""
