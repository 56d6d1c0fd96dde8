"""The unit tests' kinds (tests/unit/conftest.py): a test that loads a model without the `model` or `e2e` mark
fails, naming itself, whether it loads the model itself or a fixture of any scope loads it for it. The guard
refuses before anything is read, so these tests load nothing."""

from __future__ import annotations

import pytest

from conftest import MODEL_DIR


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
