"""The checks a pod's model must pass, run from the user's machine (`runtime check`) or by the pod on itself
(VL_SELFCHECK): whether an endpoint serves Claude Code (`endpoint`), the pod as they ask it (`asking`), the checks
(`suite`) and their images (`images`). A library: it imports no command, nor the pod."""
