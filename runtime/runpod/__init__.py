"""RunPod, in one room: its REST API v2 (`api`), the shapes of what it answers and is sent (`payloads`), and the
proxy in front of a pod's public port (`proxy`). The commands, the pod (its self-stop) and the build side import it;
it imports nothing of ours but the runtime's standard-library leaves. This file imports nothing: `proxy` stays light."""
