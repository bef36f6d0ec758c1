"""docs/architecture.md's module map and its paths stay true to the tree.

- The module map block is what ``docs/gen_module_map.py`` generates from the code now,
  and it lists every module of ``controller/`` and ``statemachine/`` (a package by its
  folder);
- the generator refuses a module without a docstring, naming it, and takes each row
  from the docstring's first sentence;
- every path the page writes in code (``controller/…``, ``statemachine/…``,
  ``tests/…``, ``docs/…``) exists; a placeholder (``statemachine/engines/<name>.py``)
  names a folder that exists.

The generator is loaded from its file and run as a function: no subprocess.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "architecture.md"
REGENERATE = "python docs/gen_module_map.py"

_INLINE = re.compile(r"(`+)(.+?)\1", re.DOTALL)
_PATH = re.compile(r"(?<![\w./-])((?:controller|statemachine|tests|docs)/[\w./<>-]*)")


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "gen_module_map", ROOT / "docs" / "gen_module_map.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GEN = _generator()


def _block(text: str) -> str:
    assert GEN.BEGIN in text and GEN.END in text, f"{PAGE.name} has no module map block"
    return text.split(GEN.BEGIN, 1)[1].split(GEN.END, 1)[0]


def test_the_module_map_is_up_to_date() -> None:
    text = PAGE.read_text(encoding="utf-8")
    assert text == GEN.render(text), (
        f"docs/architecture.md's module map is stale; regenerate it with: {REGENERATE}"
    )


def test_the_module_map_lists_every_module() -> None:
    listed = re.findall(r"^\| `([^`]+)` \|", _block(PAGE.read_text(encoding="utf-8")), re.M)
    modules = [
        p.relative_to(ROOT)
        for package in ("controller", "statemachine")
        for p in (ROOT / package).rglob("*.py")
    ]
    assert len(modules) > 100  # the walk found the tree
    expected = {
        f"{p.parent.as_posix()}/" if p.name == "__init__.py" else p.as_posix() for p in modules
    }
    missing = sorted(expected - set(listed))
    assert not missing, f"modules missing from the module map ({REGENERATE}): {missing}"
    unknown = sorted(set(listed) - expected)
    assert not unknown, f"the module map lists modules that do not exist: {unknown}"
    assert len(listed) == len(set(listed)), "a module is listed twice"


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return tmp_path


def test_a_module_without_a_docstring_stops_the_generator(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _tree(
        tmp_path,
        {
            "controller/__init__.py": '"""The shell."""\n',
            "controller/bare.py": "X = 1\n",
            "statemachine/__init__.py": '"""The core."""\n',
            "page.md": f"# Page\n\n{GEN.BEGIN}\n{GEN.END}\n",
        },
    )
    with pytest.raises(GEN.MissingDocstringError, match=r"controller/bare\.py"):
        GEN.table(root)
    assert GEN.main(["--check"], target=root / "page.md", root=root) == 2
    assert "controller/bare.py has no module docstring" in capsys.readouterr().err


def test_the_generator_writes_first_sentences_and_checks(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "controller/__init__.py": '"""The shell: ``a.b`` (e. g. this). More words."""\n',
            "controller/sub/__init__.py": '"""A package.\n\nIts details."""\n',
            "controller/sub/mod.py": '"""Uses :func:`~x.y.z` and :mod:`p.q`; a | b\nwrapped\n"""\n',
            "statemachine/__init__.py": '"""The core"""\n',
            "page.md": f"# Page\n\nprose\n\n{GEN.BEGIN}\nold\n{GEN.END}\n\nafter\n",
        },
    )
    page = root / "page.md"
    assert GEN.main(["--check"], target=page, root=root) == 1
    assert GEN.main([], target=page, root=root) == 0
    assert GEN.main(["--check"], target=page, root=root) == 0
    assert page.read_text(encoding="utf-8") == (
        f"# Page\n\nprose\n\n{GEN.BEGIN}\n"
        "| module | what it holds |\n|---|---|\n"
        "| `controller/` | The shell: `a.b` (e. g. this). |\n"
        "| `controller/sub/` | A package. |\n"
        "| `controller/sub/mod.py` | Uses `z` and `p.q`; a \\| b wrapped |\n"
        "| `statemachine/` | The core |\n"
        f"{GEN.END}\n\nafter\n"
    )


def _code_paths(text: str) -> list[str]:
    out: list[str] = []
    for span in _INLINE.finditer(text):
        out.extend(m.rstrip(".") for m in _PATH.findall(span.group(2)))
    return out


def test_the_paths_the_page_names_exist() -> None:
    paths = _code_paths(PAGE.read_text(encoding="utf-8"))
    assert "statemachine/planning/victims.py" in paths  # the pattern finds the page's paths
    missing = []
    for path in sorted(set(paths)):
        if "<" in path:  # a placeholder: the folder it goes in exists
            folder = path.split("<", 1)[0]
            if not (ROOT / folder).is_dir():
                missing.append(path)
        elif not (ROOT / path).exists():
            missing.append(path)
    assert not missing, f"docs/architecture.md names paths that do not exist: {missing}"


def test_the_path_pattern() -> None:
    assert _code_paths("`a controller/x.py` and `statemachine/engines/<name>.py`.") == [
        "controller/x.py",
        "statemachine/engines/<name>.py",
    ]
    assert _code_paths("controller/x.py outside code, `adapters/model_files`") == []
