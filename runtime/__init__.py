"""What runs inside the image and what talks to it, in wings (`docs/development.md` says where each thing is).

- `pod/`: the pod's process (`python -m runtime start`): the engines, their supervisor, the router, self-stop,
  preload, sshd and the desktop.
- `bridge/`: the Anthropic Messages API in front of vLLM; it never imports the pod.
- `engine/` and `hub/`: vLLM's command, install and weights; the pod's log and settings on the Hub.
- `state/`: the small files one process of the pod writes and another reads (engines' health, the swap…).
- `client/`: the commands run on the user's machine (`pod`, `plan`, `connect`, `launch`, `status`, `check`, `bench`);
  nothing else imports them, and no command imports another.
- `runpod/`: RunPod's API, the shapes of its data, the pod's ports and the proxy URL (the commands, the pod's
  self-stop and the build side).
- `checks/`: the checks a pod's model must pass (`runtime check`, and the pod's own: VL_SELFCHECK).
- `sizing/`: whether a model fits a card, and which cards to try (`plan`, `pod up`).
- here: the shared leaves (settings, units, redaction, logs, the GPU, health probes, our requests' headers, the live
  line) and the command line.
"""
