"""A warm test process that runs mutants in forked children, the mutant patched in memory.

Started by ``tests/mutation/mutate.py``, one per worker, in the worker's copy of the
repository: a pytest session over the whole pool (the same flags as a mutant's fresh
run), collected once, whose test loop this plugin replaces. For each mutant it is
given (one JSON line on its standard input) it forks; the child compiles the mutated
module from its AST (the original line numbers kept, so every function the mutation
did not touch compiles to equal code), gives each function whose code changed the
mutated code (``__code__``: every reference to the function, a test's ``from x
import f`` included, runs the mutant; its globals stay the real module's), empties
``functools.cache`` caches, and runs the mutant's tests, in the order given, through
pytest's own test protocol, stopping at the first failure; each test has its own
time limit (an alarm), so a mutant that hangs is stopped in the first test it hangs.
A mutant then costs a fork and its tests, where a fresh interpreter costs the imports
and a collection: most of a killed mutant's time.

Only a change inside a function's body can be patched this way; ``mutate.py`` sends
nothing else (a module constant, a default, a line run at import or collection goes
to a fresh process). A child that finds no function changed answers ``unpatched``,
and the mutant is run the fresh way: no mutant is judged on the unmutated code.

Answers (one JSON line): ``status`` is ``killed`` (a test failed or errored),
``survived`` (every test passed), ``timeout`` (a test ran past its limit: each test
has its own, from its unmutated time), ``unpatched`` or
``error ...``; ``seconds``; ``tail`` (the failing test and its last line).

It must not judge a mutant (``mutate.py`` does), nor write into the repository copy
beyond its own log.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import os
import signal
import sys
import time
import types
from pathlib import Path
from typing import Any

from mutate import mutated_tree  # the same mutation as a fresh process's (its directory)

_UNPATCHED = 71  # the child's exit status when no function's code changed
_CRASHED = 70
_USAGE = 4
_STATUS = {0: "survived", 1: "killed", _UNPATCHED: "unpatched"}


def _functions(namespace: dict[str, Any], module: str) -> dict[str, types.FunctionType]:
    """Every function defined in ``module`` reachable from its namespace, by qualname:
    module functions (unwrapped from decorators such as ``functools.cache``), and the
    methods, static and class methods and property accessors of its classes."""
    found: dict[str, types.FunctionType] = {}

    def add(obj: object) -> None:
        if isinstance(obj, (staticmethod, classmethod)):
            obj = obj.__func__
        if isinstance(obj, property):
            for accessor in (obj.fget, obj.fset, obj.fdel):
                add(accessor)
            return
        obj = inspect.unwrap(obj) if callable(obj) else obj  # type: ignore[arg-type]
        if isinstance(obj, types.FunctionType) and obj.__module__ == module:
            found.setdefault(obj.__qualname__, obj)

    def walk_class(cls: type, seen: set[int]) -> None:
        if id(cls) in seen:
            return
        seen.add(id(cls))
        for value in vars(cls).values():
            if isinstance(value, type) and value.__module__ == module:
                walk_class(value, seen)
            else:
                add(value)

    seen: set[int] = set()
    for value in list(namespace.values()):
        if isinstance(value, type) and getattr(value, "__module__", None) == module:
            walk_class(value, seen)
        else:
            add(value)
    return found


def _clear_caches(namespace: dict[str, Any]) -> None:
    for value in list(namespace.values()):
        # functools.cache/lru_cache wrappers: the pair of methods they document
        clear = getattr(value, "cache_clear", None)
        if callable(getattr(value, "cache_info", None)) and callable(clear):
            clear()


def patch(module_name: str, tree: ast.Module) -> int:
    """Give every function of ``module_name`` whose code differs in ``tree`` the
    mutated code; return how many were patched."""
    module = importlib.import_module(module_name)
    code = compile(tree, module.__file__ or module_name, "exec", dont_inherit=True)
    fresh: dict[str, Any] = {"__name__": module_name, "__file__": module.__file__}
    exec(code, fresh)
    old = _functions(vars(module), module_name)
    new = _functions(fresh, module_name)
    patched = 0
    for qualname, fn in new.items():
        original = old.get(qualname)
        if original is None or original.__code__ == fn.__code__:
            continue
        if len(original.__code__.co_freevars) != len(fn.__code__.co_freevars):
            return 0  # a closure's shape changed: not patchable
        original.__code__ = fn.__code__
        patched += 1
    _clear_caches(vars(module))
    return patched


class Server:
    """The pytest plugin of the warm process: collection runs once; in place of the
    test loop, it answers mutants until its standard input ends."""

    def __init__(self, commands: Any, proto: Any) -> None:
        self.commands = commands
        self.proto = proto
        self.failed: list[str] = []

    def pytest_runtest_logreport(self, report: Any) -> None:
        if report.failed:
            last = str(report.longreprtext).strip().splitlines()[-1:] or [""]
            self.failed.append(f"{report.nodeid} ({report.when}): {last[0]}")

    def pytest_runtestloop(self, session: Any) -> bool:
        if session.testsfailed:  # a collection error: report it, serve nothing
            self.proto.write(json.dumps({"ready": False, "errors": session.testsfailed}) + "\n")
            return True
        items = {item.nodeid: item for item in session.items}
        self.proto.write(json.dumps({"ready": True, "tests": len(items)}) + "\n")
        for line in self.commands:
            self.proto.write(json.dumps(self._answer(json.loads(line), session, items)) + "\n")
        return True  # the loop is done: pytest runs no test itself

    def _answer(
        self, request: dict[str, Any], session: Any, items: dict[str, Any]
    ) -> dict[str, Any]:
        t0 = time.monotonic()
        pid = os.fork()
        if pid == 0:
            self._child(request, session, items)
        _, wait_status = os.waitpid(pid, 0)
        dt = time.monotonic() - t0
        tail = _tail(request["out"])
        if os.WIFSIGNALED(wait_status):
            sig = os.WTERMSIG(wait_status)
            if sig == signal.SIGALRM:
                return {
                    "status": "timeout",
                    "seconds": dt,
                    "tail": "a test ran past its limit",
                }
            return {"status": f"error signal {sig}", "seconds": dt, "tail": tail}
        code = os.WEXITSTATUS(wait_status)
        return {"status": _STATUS.get(code, f"error {code}"), "seconds": dt, "tail": tail}

    def _child(self, request: dict[str, Any], session: Any, items: dict[str, Any]) -> None:
        """The forked child: patch, run the tests in the order given, stop at the
        first failure; never returns."""
        status = _CRASHED
        note = ""
        try:
            missing = [n for n in request["tests"] if n not in items]
            if missing:
                note = f"tests not collected: {', '.join(missing[:5])}"
                status = _USAGE
                return
            tree = mutated_tree(
                Path(request["path"]).read_text(), request["index"], request["change"]
            )
            if patch(request["import"], tree) == 0:
                status = _UNPATCHED
                return
            chosen = [items[n] for n in request["tests"]]
            limits: list[float] = request["limits"]
            status = 0
            for i, item in enumerate(chosen):
                after = chosen[i + 1] if i + 1 < len(chosen) else None
                # each test its own limit: a mutant that hangs is stopped in the first
                # test it hangs, not after every test's time
                signal.setitimer(signal.ITIMER_REAL, limits[i])
                item.config.hook.pytest_runtest_protocol(item=item, nextitem=after)
                signal.setitimer(signal.ITIMER_REAL, 0)
                if session.testsfailed:
                    status = 1
                    note = self.failed[-1] if self.failed else "a test failed"
                    break
            else:
                note = f"{len(chosen)} passed"
        except BaseException:  # anything the child meets is reported, never raised
            import traceback

            note = traceback.format_exc()
            status = _CRASHED
        finally:
            try:
                Path(request["out"]).write_text(note + "\n")
            finally:
                os._exit(status)


def _tail(path: str) -> str:
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.strip().splitlines()[-3:])


def main() -> int:
    config = json.loads(sys.argv[1])
    # pytest's capture takes descriptors 0-2 over: the protocol keeps its own copies
    commands = os.fdopen(os.dup(0), "r")
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    quiet = os.open(os.devnull, os.O_WRONLY)
    os.dup2(quiet, 1)  # pytest's own output must not reach the protocol
    import pytest

    server = Server(commands, proto)
    code = pytest.main([*config["files"], *config["pytest_args"]], plugins=[server])
    if code != 0:
        proto.write(json.dumps({"ready": False, "status": int(code)}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
