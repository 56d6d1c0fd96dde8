"""The unit tests' kinds (tests/unit/conftest.py): a test that loads a model without the `model` or `e2e` mark
fails, naming itself, whether it loads the model itself or a fixture of any scope loads it for it. The guard
refuses before anything is read, so these tests load nothing. A `data` test that opens no committed ledger fails
too, and every kind is a registered marker, documented, and left out of the quick loop README gives."""

from __future__ import annotations

import ast
import functools
import sys
import tomllib

import forkserver
import pytest

import conftest
from conftest import KIND_NAMES, KINDS, LEDGERS, LEDGERS_READ, MODEL_DIR, REPO, named_kinds, reads_committed_ledgers


def _load() -> None:
    from replaytests.engine.hf import adapter

    adapter._from_pretrained(MODEL_DIR, dtype="float32")


@pytest.fixture(scope="module")
def load_refused_in_a_module_fixture() -> str:
    with pytest.raises(AssertionError) as refused:
        _load()
    return str(refused.value)


def test_a_load_in_a_module_scoped_fixture_is_charged_to_the_test_it_is_set_up_for(load_refused_in_a_module_fixture):
    assert load_refused_in_a_module_fixture.startswith(
        "tests/unit/test_kinds.py::test_a_load_in_a_module_scoped_fixture_is_charged_to_the_test_it_is_set_up_for "
        "loads the model"), load_refused_in_a_module_fixture


def test_a_load_in_a_test_without_the_model_mark_is_refused():
    with pytest.raises(AssertionError, match=r"test_a_load_in_a_test_without_the_model_mark_is_refused loads the "
                                             r"model .*tiny-qwen2: mark it `model`"):
        _load()


@pytest.mark.e2e  # a child pytest run of a unit test and the conformance suite together
def test_the_conformance_suite_loads_its_model_after_a_unit_test_in_one_session(tmp_path):
    """README's test command runs the unit tests and the conformance suite in one session, where this conftest's
    guard (installed by the first unit test) sees the conformance tests too: their loads are theirs by design, never
    refused. Seen failing before the guard kept to tests/unit: each conformance test, "loads the model"."""
    proc = forkserver.run([sys.executable, "-m", "pytest", "-p", "no:xdist", "-p", "no:cacheprovider", "-q",
                           f"{__file__}::test_a_load_in_a_test_without_the_model_mark_is_refused",
                           str(REPO / "src" / "replaytests" / "conformance" / "test_replica_stability.py"),
                           "--rows", "0:1", "--precision", "fp32", "-k", "model_mark or (replica_exact and crossing)",
                           "--report-dir", str(tmp_path / "r")], cwd=REPO, timeout=600)
    last = (proc.stdout.strip().splitlines() or [""])[-1]
    assert proc.returncode == 0 and "failed" not in last and " passed" in last, proc.stdout[-3000:]
    assert "loads the model" not in proc.stdout, proc.stdout[-3000:]


def test_a_ledger_a_data_test_opens_is_charged_to_it(request):
    """This test is `data` (KINDS): what it opens under fixtures/ledgers is charged to it."""
    run = LEDGERS / "cpu-tiny-xeon" / "run.json"
    run.read_bytes()
    assert request.node.get_closest_marker("data"), "KINDS names this test `data`"
    assert str(run) in LEDGERS_READ.get(request.node.nodeid, set()), LEDGERS_READ


def test_a_data_test_that_opens_no_committed_ledger_is_refused():
    with pytest.raises(AssertionError, match=r"^tests/unit/test_kinds.py::no_such_test\[one\] is marked `data` but "
                                             r"opens no file under .*fixtures/ledgers: a test of the machinery"):
        reads_committed_ledgers("tests/unit/test_kinds.py::no_such_test[one]")


def test_every_kind_is_a_registered_marker_documented_and_out_of_the_quick_loop():
    assert set(KINDS.values()) <= set(KIND_NAMES), sorted(set(KINDS.values()) - set(KIND_NAMES))
    ini = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["pytest"]["ini_options"]
    registered = {line.split(":", 1)[0] for line in ini["markers"]}
    assert set(KIND_NAMES) <= registered, f"kinds not registered in pyproject.toml: {set(KIND_NAMES) - registered}"
    undocumented = [kind for kind in KIND_NAMES if f"- `{kind}`: " not in conftest.__doc__]
    assert not undocumented, f"tests/unit/conftest.py's docstring does not say what {undocumented} mark"
    quick = 'pytest tests/unit -m "' + " and ".join(f"not {kind}" for kind in KIND_NAMES) + '"'
    assert quick in conftest.__doc__, f"tests/unit/conftest.py's docstring does not give the quick loop {quick}"
    assert quick in (REPO / "README.md").read_text(encoding="utf-8"), f"README does not give the quick loop {quick}"


@pytest.mark.parametrize(("nodeid", "kinds"), [
    pytest.param("tests/unit/test_readme_tables.py::test_readme_shows_the_table_the_committed_ledgers_give[cells]",
                 {"data"}, id="module"),
    pytest.param("tests/unit/test_records.py::test_every_committed_ledger_round_trips_byte_for_byte[cpu-tiny]",
                 {"data"}, id="function"),
    pytest.param("tests/unit/test_records.py::test_every_committed_ledger_round_trips_byte_for_byte"
                 "[cpu-smollm2-protocol-cells/rows-00-24]", {"data"}, id="a-slash-in-the-parameter-id"),
    pytest.param("tests/unit/test_cells.py::test_int8_weights_are_quantized_at_load", {"model"}, id="itself"),
    pytest.param("tests/unit/test_records.py::test_records_are_frozen", set(), id="none"),
])
def test_kinds_names_a_module_a_function_or_one_test(nodeid, kinds):
    assert named_kinds(nodeid) == kinds


@functools.cache
def _functions(module: str) -> set[str] | None:
    """The functions a module of tests/unit defines at its top level; None where there is no such module."""
    path = REPO / "tests" / "unit" / module
    if not path.is_file():
        return None
    return {node.name for node in ast.parse(path.read_text(encoding="utf-8")).body if isinstance(node, ast.FunctionDef)}


def _exists(where: str) -> bool:
    """Whether a KINDS entry names a module of tests/unit, or a test function (any parameter set) defined in it."""
    module, _, test = where.partition("::")
    functions = _functions(module)
    return functions is not None and (not test or test.split("[", 1)[0] in functions)


def test_every_test_kinds_names_exists():
    """A test renamed or removed leaves its entry behind, and its new name another kind (a `data` test back in the
    quick loop)."""
    assert not _exists("test_records.py::no_such_test[one]") and not _exists("test_no_such_module.py")
    stale = [where for where in KINDS if not _exists(where)]
    assert not stale, f"KINDS names tests that do not exist: {stale}"


def test_the_tests_that_share_a_fixture_are_one_xdist_group(pytester):
    """A module fixture (a whole run, a model) and a session fixture that runs replaytests (SHARED_SESSION) are
    computed once per worker: the tests sharing one are one group, merged where a test shares two; a module's
    function fixtures and another module's fixture of the same name group nothing."""
    pytester.makeconftest("""
        import pytest

        @pytest.fixture(scope="session")
        def two_row_run():
            return 0
    """)
    shared = """
        import pytest

        @pytest.fixture(scope="module")
        def run():
            return 0

        @pytest.fixture(scope="module")
        def other():
            return 0

        @pytest.fixture
        def each():
            return 0
    """
    pytester.makepyfile(test_one=shared + """
        def test_a(run): pass
        def test_b(run, other): pass
        def test_c(other): pass
        def test_d(each): pass
        def test_e(two_row_run): pass
    """, test_two=shared + """
        def test_f(run): pass
        def test_g(two_row_run): pass
    """)
    items, _ = pytester.inline_genitems("-p", "no:xdist")
    groups = {item.name: group for item, group in conftest.shared_groups(items, pytester.path.parent).items()}
    assert groups == {"test_a": "test_one.py::other", "test_b": "test_one.py::other", "test_c": "test_one.py::other",
                      "test_e": "two_row_run", "test_f": "test_two.py::run", "test_g": "two_row_run"}, groups
