"""What runs inside the image and what talks to it, in wings (`docs/development.md` says where each thing is).

- `pod/`: the pod's process (`python -m runtime start`): the engines, their supervisor, the router, self-stop,
  preload, sshd and the desktop.
- `bridge/`: the Anthropic Messages API in front of vLLM; it never imports the pod.
- `engine/` and `hub/`: vLLM's command, install and weights; the pod's log and settings on the Hub.
- `state/`: the small files one process of the pod writes and another reads (engines' health, the swap…).
- `client/`: the commands run on the user's machine (`pod`, `connect`, `launch`, `status`, `check`, `bench`), the
  RunPod client and the live line; the pod never imports them but for the checks it runs on itself.
- here: the shared leaves (settings, units, redaction, logs, the GPU, health probes) and the command line.
"""
