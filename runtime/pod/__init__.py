"""The pod's process: `python -m runtime start` and the units it wires (the engines and their supervisor, the
router, the gateway role, self-stop, preload, sshd, the desktop). Nothing outside this wing imports it."""
