"""The plugin's command line: each option of a run registered under both spellings (`--replay-<field>`,
and the short alias where no other plugin or conftest took it), read back as the run's Options, and
what the arguments select (the contract, the gpu marker, the conformance tests), read before pytest
parses them too, for the early CPU pin.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from replaytests.families.registry import MARKERS
from replaytests.inputs.options import DEFAULT_CONTRACT, GPU_CONTRACT, OPTIONS, REPO, Options

CONFORMANCE = Path(__file__).resolve().parents[1] / "conformance"
DEFAULT_OPTIONS = vars(Options())
GROUP = ("replaytests", "replay conformance (replaytests)")


def spelled(field: str, namespaced: bool = True) -> str:
    """An option's command-line spelling: --replay-<field> or its short alias --<field>."""
    name = field.replace("_", "-")
    return f"--replay-{name}" if namespaced else f"--{name}"


GROUPS_INI = "replaytests_xdist_groups"  # a project's opt-in: its own tests' xdist groups kept (suite/scheduling.py)


def register(parser: pytest.Parser) -> None:
    """Every option of a run under its namespaced spelling, and --replay-progress (how the terminal shows
    a run, not one of its Options)."""
    group = parser.getgroup(*GROUP)
    for field, settings in OPTIONS.items():
        group.addoption(spelled(field), dest=f"replay_{field}", **settings)
    group.addoption("--replay-progress", dest="replay_progress", choices=("lines", "bar", "off"), default="lines",
                    help="progress of a conformance run: a plain line every 30 s and as each family and cell "
                         "completes ('lines'), one line rewritten in place instead of the test letters ('bar', for "
                         "a terminal; `replaytests audit` picks it there), or none. Default: %(default)s")
    parser.addini(GROUPS_INI, type="bool", default=False,
                  help="under --dist loadgroup, hand xdist the xdist_group marks of this project's own tests too "
                       "(pytest 9.2 broke xdist's own grouping; a replay run gets it always): suite/scheduling.py")


def _registered(parser: pytest.Parser) -> set[str]:
    """Every option string some plugin or conftest has registered."""
    groups = [getattr(parser, "_anonymous", None), *getattr(parser, "_groups", [])]
    return {name for group in groups if group is not None for option in group.options for name in option.names()}


def add_short_aliases(config: pytest.Config, parser: pytest.Parser) -> None:
    """The short spellings (--model, --precision, ...) wherever nobody else took them; a name another
    plugin or conftest registered stays theirs, with one warning naming the namespaced spelling."""
    taken = _registered(parser)
    group = parser.getgroup(*GROUP)
    clashes = [field for field in OPTIONS if spelled(field, namespaced=False) in taken]
    if twice := repeated(config.invocation_params.args, clashes):
        raise pytest.UsageError(twice)
    for field, settings in OPTIONS.items():
        if field not in clashes:
            group.addoption(spelled(field, namespaced=False), dest=f"replay_{field}",
                            **{**settings, "help": f"alias of {spelled(field)}"})
    if clashes:
        config.issue_config_time_warning(pytest.PytestConfigWarning(
            "replaytests: " + ", ".join(spelled(f, namespaced=False) for f in clashes) + " belong to another plugin "
            "or conftest here; use " + ", ".join(spelled(f) for f in clashes)), stacklevel=2)


def contract_path(contract: Path | None, markexpr: str) -> Path:
    """--contract, or the default: contracts/h200.yaml under -m gpu, else contracts/cpu-tiny.yaml."""
    if contract is not None:
        return contract
    return GPU_CONTRACT if selects_gpu(markexpr) else DEFAULT_CONTRACT


def _arguments(args: list[str] | tuple[str, ...], field: str, short: bool = True) -> list[str | None]:
    """The values given to an option on the command line (either spelling, or only --replay-<field> where
    the short one is another plugin's), before options are parsed."""
    names = (spelled(field), spelled(field, namespaced=False)) if short else (spelled(field),)
    found = []
    for index, arg in enumerate(args):
        name, equals, value = str(arg).partition("=")
        if name in names:
            found.append(value if equals else (str(args[index + 1]) if index + 1 < len(args) else None))
    return found


def _argument(args: list[str], field: str) -> str | None:
    """The value given to an option on the command line (either spelling), before options are parsed."""
    return next(iter(_arguments(args, field)), None)


def repeated(args: list[str] | tuple[str, ...], clashes: list[str]) -> str | None:
    """A one-value option given more than once, in one line, or None: argparse would keep the last one
    silently (and the early CPU pin would read the first contract)."""
    for field, settings in OPTIONS.items():
        if settings.get("action") in ("append", "store_true"):
            continue
        values = _arguments(args, field, short=field not in clashes)
        if len(values) > 1:
            return (f"{spelled(field)}: given {len(values)} times ({', '.join(map(str, values))}); give it once "
                    "(`replaytests audit -- OPTION` replaces the audit's own value)")
    return None


def early_contract(early_config: pytest.Config, args: list[str]) -> Path | None:
    """The contract file of a replay run, read from the arguments before pytest parses them; None outside
    a replay run (a contract given, replaytests named in the arguments, or this repository's own tests),
    so that a project that merely has replaytests installed keeps its own kernels, or if it is no file
    (the session reports that once it opens)."""
    given = _argument(args, "contract")
    path = contract_path(Path(given) if given else None, getattr(early_config.known_args_namespace, "markexpr", "")
                         or "")
    replay_run = given is not None or any("replaytests" in str(arg) for arg in args) or early_config.rootpath == REPO
    return path if replay_run and path.is_file() else None


def selects_gpu(expression: str) -> bool:
    """Whether a -m expression asks for the gpu marker (and would not select the items without it)."""
    if not expression:
        return False
    try:
        from _pytest.mark.expression import Expression

        compiled = Expression.compile(expression)
    except Exception:  # the private API moved, or a bad -m expression (pytest reports that itself)
        return "gpu" in expression.split()
    layers = set(MARKERS) - {"gpu"}
    return compiled.evaluate(lambda name, **_: name in layers | {"gpu"}) and not compiled.evaluate(
        lambda name, **_: name in layers)


def options(config: pytest.Config) -> Options:
    """The run's Options, from the parsed command line."""
    values = {name: config.getoption(f"replay_{name}") for name in DEFAULT_OPTIONS}
    values["accept_changed"] = frozenset(values["accept_changed"] or ())
    values["panel_from"] = tuple(values["panel_from"] or ())
    values["contract"] = contract_path(values["contract"], config.getoption("markexpr", "") or "")
    return Options(**values)


def user_gave_options(config: pytest.Config) -> bool:
    return any(config.getoption(f"replay_{name}") not in (default, None, False)
               for name, default in DEFAULT_OPTIONS.items())


def is_replay_test(node: pytest.Item, fixturenames) -> bool:
    """Whether a collected test (or the definition pytest is parametrizing) is one of replaytests' conformance
    tests: a test of its conformance package that asks for the `replay` session (`record` and every other fixture
    of the plugin's does). The plugin is installed for every pytest run in the environment: a project's own test
    whose fixtures share those names is not parametrized, marked or given a rerun command."""
    return "replay" in fixturenames and CONFORMANCE in Path(node.path).resolve().parents


def selects_conformance(config: pytest.Config) -> bool:
    """Whether the run's arguments (or testpaths) name the conformance tests, or a folder above them."""
    for arg in (str(a).split("::")[0] for a in config.args):
        if arg == "replaytests" or arg.startswith("replaytests.conformance"):  # --pyargs
            return True
        path = (config.invocation_params.dir / arg).resolve()
        if path == CONFORMANCE or CONFORMANCE in path.parents or path in CONFORMANCE.parents:
            return True
    return False
