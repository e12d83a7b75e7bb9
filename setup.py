"""Build of hrx-async: the pure-Python package, plus a mypyc-compiled core where it can be built.

The modules listed in hrx_async/_build.py (`COMPILED`) are compiled to C extension modules
with mypyc. Their .py sources ship too: an import prefers the extension module where there
is one and finds the source where there is none. The compile is best effort: when it is
switched off or fails for any reason (no C compiler, mypy or mypyc missing or failing), the
build says why on stderr and goes on as pure Python, so the install never fails because of it.

Read at build time:

* ``HRX_ASYNC_PURE=1``: do not compile.
* ``HRX_ASYNC_COMPILE=1``: compile in an editable install too (which is otherwise pure:
  extension modules next to the sources would shadow every edit to them), and let a
  failed compile fail the build instead of falling back.

The rest of the configuration is in pyproject.toml.
"""

from __future__ import annotations

import ast
import importlib.machinery
import os
import sys
import traceback
from pathlib import Path

from setuptools import Distribution, Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
BUILD_MODULE = ROOT / "hrx_async" / "_build.py"
# Where mypyc writes its C sources, away from setuptools' build/lib* and build/temp*.
C_DIR = Path("build") / "mypyc"
# One shared library holds the compiled code of every listed module (each module itself is a
# small shim importing it). Named inside the package, it is installed inside the package,
# not at the top of site-packages.
GROUP = "hrx_async._compiled"


def compiled_modules() -> list[str]:
    """`COMPILED` of hrx_async/_build.py, read as a literal: the package cannot be imported
    while it is being built (its dependencies may not be installed yet)."""
    tree = ast.parse(BUILD_MODULE.read_text(encoding="utf-8"), filename=str(BUILD_MODULE))
    for node in tree.body:
        if isinstance(node, ast.AnnAssign | ast.Assign) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "COMPILED" for t in targets):
                return list(ast.literal_eval(node.value))
    raise SystemExit(f"{BUILD_MODULE}: no COMPILED = (...) literal found")


def flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def say(message: str) -> None:
    print(f"hrx-async build: {message}", file=sys.stderr, flush=True)


def mypy_config(modules: list[str], path: Path) -> Path:
    """The mypy configuration of the compile.

    The type check that decides is the project's own (`mypy hrx_async`, strict). Here mypy
    only has to hand mypyc the types of the compiled modules, which keep the strict rules.
    The other modules, read to follow imports, report nothing, so the build environment
    needs only the packages the compiled modules use (numpy, anyio, trio), not the optional
    ones elsewhere in the package.
    """
    lines = ["[mypy]", "strict = True", "ignore_missing_imports = True", ""]
    lines += ["[mypy-hrx_async.*]", "ignore_errors = True", ""]
    for module in modules:
        lines += [f"[mypy-{module}]", "ignore_errors = False", ""]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def mypyc_extensions(modules: list[str]) -> list[Extension]:
    """The extensions of the compiled core; mypyc writes their C sources into C_DIR now."""
    from mypyc.build import mypycify

    paths = [str(Path(*module.split(".")).with_suffix(".py")) for module in modules]
    config = mypy_config(modules, C_DIR / "mypy.ini")
    options = ["--config-file", str(config), "--cache-dir", str(C_DIR / "mypy-cache")]
    return list(mypycify([*options, *paths], target_dir=str(C_DIR), group_name=GROUP))


def extension_files(root: Path) -> list[Path]:
    """The extension modules in the package under `root` (a build or a source tree). The
    package has no C code of its own, so all of them come from a compile of the core."""
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    package = root / "hrx_async"
    return sorted(path for path in package.rglob("*") if path.name.endswith(suffixes))


class OptionalMypycBuild(build_ext):
    """build_ext that compiles the core when it can, and otherwise builds nothing.

    mypyc runs in `run`, when extensions are really built, not whenever the command is
    finalized (an sdist or a metadata query finalizes it too). setuptools works out each
    extension's output file while finalizing, though, so the extensions exist from then on,
    by name, and `run` fills in the C sources that mypyc writes.
    """

    modules: list[str]
    in_place: bool
    why_pure: str | None

    def finalize_options(self) -> None:
        self.modules = compiled_modules()
        self.in_place = bool(self.inplace or getattr(self, "editable_mode", False))
        self.why_pure = None
        if flag("HRX_ASYNC_PURE"):
            self.why_pure = "HRX_ASYNC_PURE is set"
        elif not self.modules:
            self.why_pure = "hrx_async/_build.py COMPILED lists no module"
        elif self.in_place and not flag("HRX_ASYNC_COMPILE"):
            self.why_pure = "editable install (HRX_ASYNC_COMPILE=1 compiles in place)"
        names = [] if self.why_pure else [f"{GROUP}__mypyc", *self.modules]
        self.distribution.ext_modules = [Extension(name, sources=[]) for name in names]
        super().finalize_options()

    def run(self) -> None:
        # Nothing may be left over from an earlier compile (of another module list, say): in
        # the build tree it would be packed into this wheel, in the sources it would shadow
        # them; and a failed compile leaves nothing either, as the build is all or nothing.
        self.remove_compiled()
        if self.why_pure is None:
            try:
                self.compile_core()
            except (Exception, SystemExit) as exc:  # mypy and mypyc report failures by exiting
                if flag("HRX_ASYNC_COMPILE"):
                    raise
                traceback.print_exc()
                self.why_pure = f"the compile failed ({type(exc).__name__}: {exc})"
                self.remove_compiled()
            else:
                say(f"compiled with mypyc: {', '.join(self.modules)}")
                return
        self.extensions = []
        say(f"pure Python: {self.why_pure}")

    def remove_compiled(self) -> None:
        stale = extension_files(Path(self.build_lib))
        if self.in_place:
            stale += extension_files(ROOT)
        for path in stale:
            say(f"removing {path}")
            path.unlink()

    def compile_core(self) -> None:
        generated = {extension.name: extension for extension in mypyc_extensions(self.modules)}
        expected = {extension.name for extension in self.extensions}
        if set(generated) != expected:
            raise RuntimeError(f"mypyc made extensions {sorted(generated)}, not {sorted(expected)}")
        for extension in self.extensions:
            # What setuptools derived while finalizing is kept in private attributes.
            derived = {key for key in vars(extension) if key.startswith("_")}
            for key, value in vars(generated[extension.name]).items():
                if key not in derived:
                    setattr(extension, key, value)
        super().run()


class MaybeCompiledDistribution(Distribution):
    """Has extension modules (so build_ext runs, and the wheel is tagged for this
    interpreter) unless HRX_ASYNC_PURE is set; an editable install runs build_ext even
    then, to remove what an earlier in-place compile left next to the sources."""

    def has_ext_modules(self) -> bool:
        in_place = any(command in self.commands for command in ("editable_wheel", "develop"))
        return in_place or not flag("HRX_ASYNC_PURE")


if __name__ == "__main__":  # also how setuptools' PEP 517 backend runs this file
    setup(distclass=MaybeCompiledDistribution, cmdclass={"build_ext": OptionalMypycBuild})
