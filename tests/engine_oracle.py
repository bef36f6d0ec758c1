"""The real llama.cpp server as an oracle: what it says it allocates when it loads a model.

:func:`load_figures` starts ``llama-server`` (the image tests/docker/ensure-engine.sh
builds) on a model file with the given flags and ``--verbose``, reads its load log
until it has reported every buffer, and removes the container. The figures are the
engine's own lines (``src/llama-model.cpp``, ``src/llama-kv-cache.cpp``,
``src/llama-context.cpp``), which it prints in MiB with two decimals:

* ``load_tensors:   CPU_Mapped model buffer size =     4.51 MiB``
* ``llama_kv_cache: size =    2.00 MiB (  1024 cells,   4 layers,  2/2 seqs), K (f16): …``
* ``sched_reserve:        CPU compute buffer size =     6.52 MiB``

:data:`CASES` are the files, contexts, ``--parallel`` and cache types the oracle test
(tests/e2e/test_real_engine_sizing.py) and the table in docs/sizing.md cover; a case's
flags come from ``vramctl render`` (:func:`render_flags`). ``python
tests/engine_oracle.py --docs`` rewrites that table from a run of the engine.

What this module must not do: compute what the engine should say. The tests compare
these figures with ``vramctl estimate``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
from docker.errors import NotFound

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script too
import contextlib

from engine_models import SHAPES, write

MIB = 1 << 20
REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs" / "sizing.md"
BEGIN = "<!-- engine-oracle:begin (python tests/engine_oracle.py --docs) -->"
END = "<!-- engine-oracle:end -->"


@dataclass(frozen=True)
class Case:
    """A model file (a :data:`engine_models.SHAPES` key) and how a serve runs it."""

    shape: str
    context: int | None  # per sequence; None: the model's own
    parallel: int
    kv_dtype: str

    @property
    def id(self) -> str:
        ctx = "own" if self.context is None else str(self.context)
        return f"{self.shape}-ctx{ctx}-np{self.parallel}-{self.kv_dtype}"


CASES = (
    Case("plain", 1024, 1, "f16"),
    Case("gqa", 1000, 2, "f16"),
    Case("q8", 512, 1, "q8_0"),
    Case("long", None, 1, "f16"),
    Case("plain", 700, 3, "q4_0"),
    Case("gqa", 2048, 1, "bf16"),
)

_MODEL = re.compile(r"load_tensors: +\S+ model buffer size = +([\d.]+) MiB")
_KV = re.compile(
    r"llama_kv_cache: size = +([\d.]+) MiB \( *(\d+) cells, +(\d+) layers, +(\d+)/(\d+) seqs\)"
    r", K \((\w+)\): +([\d.]+) MiB, V \((\w+)\): +([\d.]+) MiB"
)
_COMPUTE = re.compile(r"sched_reserve: +\S+ compute buffer size = +([\d.]+) MiB")
_N_CTX = re.compile(r"llama_context: n_ctx += (\d+)")


@dataclass(frozen=True)
class Figures:
    """What one load of the engine reported (MiB as printed: two decimals)."""

    model_mib: float
    kv_mib: float
    kv_cells: int
    kv_seqs: int
    k_type: str
    v_type: str
    compute_mib: float
    n_ctx: int
    log: str


_FIT = re.compile(r"memory breakdown \[MiB\].*\n.*- Host +\| +(\d+) = +(\d+) \+ +(\d+) \+ +(\d+)")


@dataclass(frozen=True)
class FitFigures:
    """What ``llama-fit-params`` projects on this CPU build: whole MiB on the host (its
    only device) for the model, the context (KV cache and outputs) and the compute
    buffer, and the arguments it prints."""

    total_mib: int
    model_mib: int
    context_mib: int
    compute_mib: int
    args: str


class EngineFailedError(Exception):
    """The engine exited before it reported its buffers; ``log`` is what it said."""

    def __init__(self, exit_code: int, log: str) -> None:
        super().__init__(f"llama-server exited {exit_code} before loading:\n{log[-2000:]}")
        self.exit_code = exit_code
        self.log = log


def _last(pattern: re.Pattern[str], log: str) -> re.Match[str] | None:
    found = list(pattern.finditer(log))
    return found[-1] if found else None


def parse(log: str) -> Figures | None:
    """The figures of the last complete load in ``log`` (the fit step loads once before)."""
    model, kv, compute, n_ctx = (_last(p, log) for p in (_MODEL, _KV, _COMPUTE, _N_CTX))
    if model is None or kv is None or compute is None or n_ctx is None:
        return None
    return Figures(
        model_mib=float(model[1]),
        kv_mib=float(kv[1]),
        kv_cells=int(kv[2]),
        kv_seqs=int(kv[5]),
        k_type=kv[6],
        v_type=kv[8],
        compute_mib=float(compute[1]),
        n_ctx=int(n_ctx[1]),
        log=log,
    )


def load_figures(
    client: docker.DockerClient,
    image: str,
    model: Path,
    flags: list[str],
    *,
    timeout_s: float = 300,
) -> Figures:
    """Start the engine on ``model`` with ``flags``; its figures once it reported them all."""
    name = f"vramctl-test-oracle-{uuid.uuid4().hex[:8]}"
    argv = ["-m", f"/models/{model.name}", "--port", "0", "--verbose", "--fit", "off", *flags]
    c = client.containers.run(
        image,
        argv,
        name=name,
        detach=True,
        network_mode="none",
        labels={"vramctl.test": "1"},
        volumes={str(model.parent): {"bind": "/models", "mode": "ro"}},
    )
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            log = c.logs().decode(errors="replace")
            c.reload()
            figures = parse(log) if "compute buffer size" in log else None
            if figures is not None:
                return figures
            if c.status == "exited":
                code = int(c.attrs["State"]["ExitCode"])
                raise EngineFailedError(code, c.logs().decode(errors="replace"))
            time.sleep(0.2)
        raise TimeoutError(f"llama-server reported no buffers in {timeout_s} s")
    finally:
        with contextlib.suppress(NotFound):
            c.remove(force=True)


def _vramctl(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, COLUMNS="200", NO_COLOR="1")
    argv = [sys.executable, "-m", "controller.interfaces.cli", *args]
    return subprocess.run(argv, capture_output=True, text=True, env=env, cwd=REPO, check=False)


def manifest(folder: Path, model: Path, case: Case, *, vram_mib: int = 4096) -> Path:
    """A one-serve manifest running ``model`` on llama.cpp as ``case`` says."""
    ctx = "" if case.context is None else f"context = {case.context}\n"
    path = folder / f"{case.id}.toml"
    path.write_text(
        f'[[gpu_roles]]\nid = "a"\nvram_mib = {vram_mib}\nreserve_mib = 0\n\n'
        f'[[serve]]\nname = "chat"\nengine = "llama.cpp"\ncontainer = "chat"\n'
        f'gpu_role = "a"\nvram_mib = {vram_mib}\nresidency = "evictable"\n'
        f'[serve.model]\npath = "{model}"\n{ctx}parallel = {case.parallel}\n'
        f'kv_dtype = "{case.kv_dtype}"\n'
    )
    return path


def render_flags(folder: Path, model: Path, case: Case) -> list[str]:
    """The engine flags ``vramctl render`` gives the case's serve."""
    r = _vramctl("render", "chat", "-m", str(manifest(folder, model, case)))
    if r.returncode != 0:
        raise AssertionError(f"render failed ({r.returncode}): {r.stdout}{r.stderr}")
    return shlex.split(r.stdout)


def estimate(model: Path, case: Case) -> dict[str, Any]:
    """``vramctl estimate --engine llamacpp --json`` of ``model`` run as ``case`` says."""
    args = ["estimate", str(model), "--engine", "llamacpp", "--parallel", str(case.parallel)]
    args += ["--kv-dtype", case.kv_dtype, "--json"]
    if case.context is not None:
        args += ["--context", str(case.context)]
    r = _vramctl(*args)
    if r.returncode != 0:
        raise AssertionError(f"estimate failed ({r.returncode}): {r.stdout}{r.stderr}")
    answer: dict[str, Any] = json.loads(r.stdout)
    return answer


def formula_tokens(formula: str) -> int:
    """The tokens per sequence and layer in an estimate's KV formula (``× 1024 tokens``)."""
    found = re.findall(r"× (\d+) tokens", formula)
    if len(found) != 1:
        raise AssertionError(f"not one token count in {formula!r}")
    return int(found[0])


def fit_params(
    client: docker.DockerClient, image: str, model: Path, flags: list[str]
) -> FitFigures:
    """Run ``llama-fit-params`` (same source) on ``model`` with ``flags``, less the layer
    count: a count given is kept as it is, and nothing is projected."""
    at = flags.index("--n-gpu-layers") if "--n-gpu-layers" in flags else len(flags)
    rest = flags[:at] + flags[at + 2 :]
    c = client.containers.run(
        image,
        ["-m", f"/models/{model.name}", "--verbose", *rest],
        entrypoint="llama-fit-params",
        detach=True,
        network_mode="none",
        labels={"vramctl.test": "1"},
        volumes={str(model.parent): {"bind": "/models", "mode": "ro"}},
    )
    try:
        c.wait(timeout=300)
        printed = c.logs(stdout=True, stderr=False).decode(errors="replace")
        out = c.logs(stdout=False, stderr=True).decode(errors="replace")
    finally:
        c.remove(force=True)
    found = _FIT.search(out)
    if found is None:
        raise AssertionError(f"llama-fit-params printed no host breakdown:\n{out[-2000:]}")
    args = printed.strip()
    total, mdl, ctx, compute = (int(found[i]) for i in range(1, 5))
    return FitFigures(total, mdl, ctx, compute, args)


@dataclass(frozen=True)
class Row:
    """One case: the estimate's figures beside the engine's."""

    case: Case
    flags: str
    weights_bytes: int
    kv_bytes: int
    kv_tokens: int
    figures: Figures
    fit: FitFigures


def run_case(client: docker.DockerClient, image: str, folder: Path, case: Case) -> Row:
    """Write the case's file, render its flags, load it in the engine, estimate it."""
    model = write(SHAPES[case.shape], folder / f"{case.shape}.gguf")
    flags = render_flags(folder, model, case)
    figures = load_figures(client, image, model, flags)
    fit = fit_params(client, image, model, flags)
    est = estimate(model, case)
    return Row(
        case,
        shlex.join(flags),
        int(est["weights_bytes"]),
        int(est["kv_cache_bytes"]),
        formula_tokens(str(est["formula"])),
        figures,
        fit,
    )


def _mib(n: int) -> str:
    return f"{n} ({n / MIB:.2f})"


def table(rows: Sequence[Row]) -> str:
    """The docs' table: each case's estimate (bytes, and MiB as the engine prints them)
    beside the engine's own figures; the compute buffer, the last column, is measured."""
    out = [
        "| model | flags (`vramctl render`) | weights, estimate | model buffer, engine "
        "| KV cache, estimate | KV buffer, engine | cells per sequence, estimate / engine "
        "| llama-fit-params: model + context (MiB) "
        "| compute buffer, engine (estimate: unknown) |",
        "|---|---|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for r in rows:
        f = r.figures
        out.append(
            f"| {r.case.shape} | `{r.flags}` | {_mib(r.weights_bytes)} | {f.model_mib:.2f} "
            f"| {_mib(r.kv_bytes)} | {f.kv_mib:.2f} | {r.kv_tokens} / {f.kv_cells} "
            f"| {r.fit.model_mib} + {r.fit.context_mib} "
            f"| {f.compute_mib:.2f} MiB (fit-params: {r.fit.compute_mib}) |"
        )
    return "\n".join(out)


def without_measured(text: str) -> list[str]:
    """A table's lines without the last column (the compute buffer this build measured)."""
    return [line.rstrip("|").rsplit("|", 1)[0] for line in text.strip().splitlines()]


def docs_table(text: str) -> str:
    """The table between the markers in docs/sizing.md."""
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    return text[start:end].strip()


def main(argv: Sequence[str] | None = None) -> int:
    """``--docs``: run every case on the engine image and rewrite docs/sizing.md's table."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--docs", action="store_true", help="rewrite the table in docs/sizing.md")
    ap.add_argument("--image", default=os.environ.get("VRAMCTL_ENGINE_IMAGE", ""))
    args = ap.parse_args(argv)
    if not args.image or args.image == "unavailable":
        print("engine_oracle: no engine image: run tests/docker/ensure-engine.sh", file=sys.stderr)
        return 2
    client = docker.from_env()
    with tempfile.TemporaryDirectory() as tmp:
        text = table([run_case(client, args.image, Path(tmp), c) for c in CASES])
    if not args.docs:
        print(text)
        return 0
    doc = DOCS.read_text()
    start, end = doc.index(BEGIN) + len(BEGIN), doc.index(END)
    DOCS.write_text(doc[:start] + "\n" + text + "\n" + doc[end:])
    print(f"engine_oracle: wrote the table in {DOCS.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
