"""An emulated LLM serving engine, for tests, the demo, the benchmarks and test Pods.

No model runs here (no GPU, no weights can be had): ``tinct emulator`` answers the OpenAI
API with placeholder tokens on the schedule its :class:`Behaviour` sets (time to first token,
inter-token latency, 5xx and 429 shares, contract breaks, a slot-limited queue) and exports
on ``/metrics`` the metric names vLLM, SGLang or TGI export, so everything that reads an
engine — the router's token measurements, the release analysis, autoscaling on queue depth —
can be exercised for real against it.

- :mod:`~tinct.emulator.behaviour`: the knobs, their bounds, flags and environment
- :mod:`~tinct.emulator.engine`: slots, queue, KV cache, counts
- :mod:`~tinct.emulator.names`: each engine's metric names, checked against its sources
- :mod:`~tinct.emulator.metrics`: ``/metrics``
- :mod:`~tinct.emulator.lora`: LoRA adapters loaded and unloaded at run time
- :mod:`~tinct.emulator.server`: the HTTP endpoints; :func:`serving` runs one in a test
- :mod:`~tinct.emulator.cli`: ``tinct emulator``
"""

from tinct.emulator.behaviour import Behaviour, BehaviourError
from tinct.emulator.server import EMULATOR_HEADER, Emulator, make_app, serving

__all__ = ["EMULATOR_HEADER", "Behaviour", "BehaviourError", "Emulator", "make_app", "serving"]
