import os
import sys

# The replaytests plugin itself is registered through the `pytest11` entry point (pyproject.toml);
# pytester drives it in the suite's own tests.
pytest_plugins = ["pytester"]

# The suite starts about a hundred processes (whole runs in children, the CLI, benchmarks, the xdist workers).
# Where PYTHONDONTWRITEBYTECODE is set, as on some CI images, each of them compiles replaytests' modules again and
# rewrites the conformance tests' assertions again: about 1 s a process. The suite's processes write their
# bytecode (into __pycache__/, which git ignores); installed packages keep what pip wrote either way.
if os.environ.pop("PYTHONDONTWRITEBYTECODE", None) is not None:
    sys.dont_write_bytecode = False
