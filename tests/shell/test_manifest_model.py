"""``model`` in the manifest: a name (a string, informational) or ``[serve.model]``, the
model's files and the cache the estimate assumes (docs/manifest.md, docs/sizing.md).

The names are a contract: ``path``, ``context``, ``kv_dtype``, ``parallel``, ``name``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.manifest_rules import ROLES, Expect, check, errors_of, serve, write

from controller.manifest import load_manifest_set
from controller.manifest.runtime import ModelRef

S1 = 'serve "s1" (#1)'
BASE = 'gpu_role = "a"\nvram_mib = 800\n'


def with_model(table: str) -> str:
    return ROLES + serve(BASE + "\n[serve.model]\n" + table)


def test_a_table_names_the_files_relative_to_the_manifests_folder(tmp_path: Path) -> None:
    (tmp_path / "conf").mkdir()
    text = with_model('path = "../models/m.gguf"\ncontext = 8192\nkv_dtype = "Q8_0"\nparallel = 4')
    paths = write(tmp_path / "conf", {"serves.toml": text})
    ref = load_manifest_set(paths).runtime()["s1"].model
    assert ref == ModelRef(
        path=(tmp_path / "models" / "m.gguf").resolve(), context=8192, kv_dtype="q8_0", parallel=4
    )


def test_the_table_defaults_to_the_models_context_an_f16_cache_and_one_sequence(
    tmp_path: Path,
) -> None:
    paths = write(tmp_path, {"serves.toml": with_model('path = "/srv/models/qwen"')})
    ref = load_manifest_set(paths).runtime()["s1"].model
    assert ref == ModelRef(path=Path("/srv/models/qwen"), context=None, kv_dtype="f16", parallel=1)


def test_a_string_stays_an_informational_name(tmp_path: Path) -> None:
    paths = write(tmp_path, {"serves.toml": ROLES + serve(BASE + 'model = "bge-m3"')})
    loaded = load_manifest_set(paths)
    assert loaded.serves["s1"].model == "bge-m3"
    assert loaded.runtime()["s1"].model is None


@pytest.mark.parametrize(
    ("table", "expected"),
    [
        ('path = "m.gguf"\nkv_dtype = "q8_o"', Expect(S1, "model.kv_dtype", ("q8_0", "q8_o"))),
        ('path = "m.gguf"\ncontext = 0', Expect(S1, "model.context", ("positive",))),
        ('path = "m.gguf"\nparallel = -2', Expect(S1, "model.parallel", ("positive",))),
        ('path = ""', Expect(S1, "model.path", ("non-empty",))),
        ("context = 4096", Expect(S1, "model.path", ("required",))),
        ('path = "m.gguf"\ncontxt = 4096', Expect(S1, "model.contxt", ('"context"',))),
    ],
)
def test_a_bad_table_is_a_located_error(tmp_path: Path, table: str, expected: Expect) -> None:
    check(errors_of(write(tmp_path, {"serves.toml": with_model(table)})), (expected,))


def test_an_empty_name_is_a_located_error(tmp_path: Path) -> None:
    paths = write(tmp_path, {"serves.toml": ROLES + serve(BASE + 'model = ""')})
    check(errors_of(paths), (Expect(S1, "model", ("non-empty",)),))
