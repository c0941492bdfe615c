"""Sizing a model, as `runtime plan` and `pod up` ask it: the cards (`cards`), the fit of a model on a card (`fit`),
the model's facts (`model`, from a recipe; `repo`, from a Hub repository's files), the cards on offer (`offers`),
their verdicts (`verdicts`) and `pod up`'s choice of GPU types and data centres (`choice`). A library: it imports no
command; RunPod's catalogue comes through runtime/runpod."""
