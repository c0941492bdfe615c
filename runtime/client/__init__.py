"""The commands run on the user's machine: `pod` (RunPod), `connect`, `launch`, `status`, `check`, `bench`, with
the RunPod client, who the commands say they are (`identity`) and the terminal's live line.

The pod imports from here only the checks it runs on itself (VL_SELFCHECK) and the RunPod client it stops itself
with; tests/test_import_directions.py holds that list."""
