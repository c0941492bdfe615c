"""The pod's state files: small files in VL_STATE_DIR that one process of the pod writes and another reads (the
engines' health, the swap, preload's progress, the self-check, the Hub log's refusal, the bench, the activity).

Each module here imports only the standard library and its neighbours: the bridge, the pod and the probes read
them without importing each other."""
