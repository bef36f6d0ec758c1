"""The real llama.cpp server as the oracle for sizing (docs/sizing.md, "The real engine's
own figures").

For each model file tests/engine_models.py writes and each context, ``--parallel`` and
cache type of ``engine_oracle.CASES``, the serve's flags come from ``vramctl render``
(nothing hand-written), the real ``llama-server`` loads the file with them, and its
load log (tests/engine_oracle.py) is set beside ``vramctl estimate --engine llamacpp``:

* the weights are the engine's model buffer, and the KV cache its KV buffer, to the
  engine's printed precision (MiB with two decimals: the bytes agree within 0.005 MiB);
* the KV cache holds the cells per sequence the estimate's formula counts (llama.cpp
  pads each sequence's context to 256 cells);
* ``llama-fit-params`` (same source; it runs on a CPU build, the host its only device)
  projects the same model and context, in whole MiB;
* the compute buffer, which ``estimate`` gives as unknown (``activations``), is what
  the engine measured: docs/sizing.md shows it as measured.

The table in docs/sizing.md is the one these runs make (``python tests/engine_oracle.py
--docs`` writes it); its last column, this build's measured compute buffer, is not
compared.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import docker
import pytest
from engine_models import SHAPES, write
from engine_oracle import (
    CASES,
    DOCS,
    MIB,
    Case,
    Row,
    docs_table,
    render_flags,
    run_case,
    table,
    without_measured,
)

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.xdist_group("real-engine")]


@pytest.fixture(scope="module")
def rows(
    engine_image: str, docker_client: docker.DockerClient, tmp_path_factory: pytest.TempPathFactory
) -> dict[Case, Row]:
    """Every case run once on the engine (its load log and llama-fit-params) beside the
    estimate: the per-case checks and the docs' table read the same runs."""
    folder = tmp_path_factory.mktemp("engine-oracle")
    return {case: run_case(docker_client, engine_image, folder, case) for case in CASES}


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_the_engine_allocates_the_weights_and_kv_cache_the_estimate_counts(
    case: Case, rows: dict[Case, Row]
) -> None:
    row = rows[case]
    f = row.figures
    assert round(row.weights_bytes / MIB, 2) == f.model_mib, (row.weights_bytes, f.model_mib)
    assert round(row.kv_bytes / MIB, 2) == f.kv_mib, (row.kv_bytes, f.kv_mib)
    assert row.kv_tokens == f.kv_cells
    assert (f.k_type, f.v_type, f.kv_seqs) == (case.kv_dtype, case.kv_dtype, case.parallel)
    assert f.compute_mib > 0  # measured by the engine; the estimate names it unknown
    # llama-fit-params (same source) projects the same, in whole MiB, on the host
    assert (row.fit.model_mib, row.fit.context_mib) == (
        row.weights_bytes // MIB,
        row.kv_bytes // MIB,
    )
    assert row.fit.args.endswith("-ngl -1")  # a CPU build: every layer on its only device


def test_the_sizing_docs_table_is_the_engines_own(rows: dict[Case, Row]) -> None:
    have = without_measured(docs_table(DOCS.read_text()))
    assert have == without_measured(table([rows[c] for c in CASES])), (
        "docs/sizing.md's table is not this run's: `python tests/engine_oracle.py --docs`"
    )


def test_the_oracles_flags_are_renders(tmp_path: Path) -> None:
    """A context of 1000 tokens × 2 slots in q8_0: render's words, as the engine takes them."""
    model = write(SHAPES["gqa"], tmp_path / "gqa.gguf")
    flags = render_flags(tmp_path, model, Case("gqa", 1000, 2, "q8_0"))
    assert shlex.join(flags).startswith("--n-gpu-layers 5 --ctx-size 2000 --parallel 2")
    assert flags[-4:] == ["--cache-type-k", "q8_0", "--cache-type-v", "q8_0"]
