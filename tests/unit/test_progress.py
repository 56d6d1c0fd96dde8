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
    progress.finish()  # the first test: the time before it (40 s) is not counted in the rate
    clock.now += INTERVAL
    for _ in range(3):
        progress.finish()
    line = progress.line()
    assert line == ("replaytests progress: 4/10 tests, 1m10s elapsed, ETA 1m00s; rows: crossing bf16 1/2, "
                    "crossing fp32 0/2, transplant bf16 0/?"), line


def test_no_estimate_from_a_burst_of_tests_finished_with_the_first(progress, clock):
    clock.now += 60
    for _ in range(5):
        progress.finish()  # five tests that read one record
    assert progress.eta() is None, f"an estimate from a burst: {progress.eta()}"
    clock.now += INTERVAL - 1
    assert progress.eta() is None, "an estimate before INTERVAL seconds of tests"
    clock.now += 1
    assert progress.eta() == pytest.approx(INTERVAL * 5 / 4), progress.eta()
    for _ in range(5):
        progress.finish()
    assert progress.eta() == 0, "time left once every test finished"


# A 48-row `replaytests audit` (1,223 tests, 343 s, 2-core AVX2-only EPYC): each progress line's elapsed seconds and
# finished tests (its first with tests, at 135 s, taken as the first test's finish: after collection, the session's
# open, the model's load and the first records).
AUDIT_LOG = ((135, 6), (166, 130), (198, 258), (219, 390), (236, 464), (251, 598), (259, 659), (268, 724), (286, 778),
             (293, 800), (305, 1041), (324, 1133), (339, 1218))


def test_the_estimate_replayed_from_an_audits_log_is_nearer_the_time_left_than_one_from_the_start(clock):
    progress = Progress({}, clock)
    progress.tests, start, end = 1223, clock.now, clock.now + 343
    for elapsed, finished in AUDIT_LOG:
        clock.now = start + elapsed
        for _ in range(finished - progress.finished):
            progress.finish()
        eta, left = progress.eta(), end - clock.now
        from_start = elapsed * (progress.tests - finished) / finished  # the rate over the whole run so far
        if eta is None:
            assert elapsed - AUDIT_LOG[0][0] < INTERVAL, f"no estimate at {elapsed} s"
            continue
        if finished > 0.9 * progress.tests:  # the last seconds: both estimates are a few seconds of a few left
            continue
        assert abs(eta - left) < abs(from_start - left), (elapsed, eta, from_start, left)
        assert left / 2 <= eta <= left * 2, f"at {elapsed} s the estimate {eta:.0f} s is off the {left} s left twice"


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
