"""The adapters: the only code that speaks to Docker, NVML, the router, engines and health
paths, and that reads a model's files.

Each adapter turns one outside system into plain values (``docker`` reads and acts on
containers, ``nvml`` reads devices, ``router`` quiesces / drains / readmits tiers,
``elastic`` resizes an engine's reservation, ``health`` probes a serve's health path,
``model_files`` reads a model's weights and architecture for ``estimate``); ``retry`` is
the error type and retry pacing they share. Only these modules import ``docker``,
``pynvml`` and ``httpx`` (the API's client side excepted), and only ``model_files``
imports ``gguf``.

They must not decide: no planning, no ledger arithmetic, no backoff policy; and an
adapter must not import a sibling adapter (``retry`` excepted), so each can be replaced
or faked alone. They may import the observation contract (``controller.snapshot``) and
the pure core's types.
"""
