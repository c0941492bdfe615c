"""What runs inside the image: sshd, vLLM and the Anthropic bridge, kept alive and reconfigurable."""
