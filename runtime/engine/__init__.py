"""The engine side of the pod: vLLM's command (`command`), its install (`install`), the model recipes
(`recipes`), the weights and caches on the volume (`weights`, `volume`) and the tiny demo model.

Imports nothing: `vllm_cli` and `tinymodel` run in the engine's environment and at image build time.
"""
