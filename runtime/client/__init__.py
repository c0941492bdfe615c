"""The commands run on the user's machine: `pod` (RunPod), `plan`, `connect`, `launch`, `status`, `check`, `bench`, one
module (or package: `pods`) each, and what they share: which pod they ask and with which key (`identity`), Claude
Code's environment (`environment`), the tables' layout (`columns`). No command imports another; no other wing imports
this one (tests/test_import_directions.py): the libraries they call are runtime/runpod, runtime/checks, runtime/sizing."""
