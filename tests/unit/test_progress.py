"""Progress lines and the bar: counts per family and precision, elapsed time and the estimate."""

import pytest

from replaytests.suite.progress import INTERVAL, Progress, duration


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def progress(clock):
    shown = Progress({("crossing", "bf16"): 2, ("crossing", "fp32"): 2, ("transplant", "bf16"): None}, clock)
    shown.tests = 10
    return shown


@pytest.mark.parametrize(("seconds", "text"), [(0, "0s"), (59.4, "59s"), (61, "1m01s"), (3725, "1h02m")])
def test_duration(seconds, text):
    assert duration(seconds) == text


def test_a_group_completes_on_its_last_planned_row(progress):
    assert progress.record("crossing", "r0", "bf16") is False
    assert progress.record("crossing", "r0", "bf16") is False, "a row seen twice (two workers) counts once"
    assert progress.record("crossing", "r1", "bf16") is True
    assert progress.record("transplant", "r1", "bf16") is False, "a panel of unknown size never completes"


def test_line_names_every_group_and_the_estimate(progress, clock):
    assert "ETA -" in progress.line(), "an estimate before any test finished"
    progress.record("crossing", "r0", "bf16")
    clock.now += 40
    progress.finished += 4
    line = progress.line()
    assert line == ("replaytests progress: 4/10 tests, 40s elapsed, ETA 1m00s; rows: crossing bf16 1/2, "
                    "crossing fp32 0/2, transplant bf16 0/?"), line


def test_bar_shows_only_the_groups_in_progress(progress, clock):
    progress.record("crossing", "r0", "bf16")
    progress.record("crossing", "r0", "fp32")
    progress.record("crossing", "r1", "fp32")
    progress.finished += 5
    bar = progress.bar()
    assert bar.startswith("[############............] 5/10 tests"), bar
    assert bar.endswith("| crossing bf16 1/2"), f"only the started, unfinished group belongs in the bar: {bar}"


def test_a_plain_line_is_due_every_interval(progress, clock):
    assert not progress.due()
    clock.now += INTERVAL
    assert progress.due()
    assert not progress.due(), "the line just shown resets the interval"
