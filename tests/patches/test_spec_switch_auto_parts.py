"""The auto switch's parts on their own (0014): its arguments, and the learner's step costs
(spec_switch_costs) and threshold fit (spec_switch_fit) on steps and gains given directly (the
serving tests are test_spec_switch_auto.py)."""

from __future__ import annotations

import math

import pytest

from switch_helpers import handled_switch_args


def test_auto_bounds_the_learned_thresholds(tmp_path):
    from sglang.srt.speculative.spec_switch import SpecSwitch

    args = handled_switch_args(tmp_path, speculative_disable_batch_size="auto")
    assert args.speculative_switch_auto
    # The bounds size the graph sets: verify graphs up to the cap, plain-decode graphs from 1.
    assert (args.speculative_disable_batch_size, args.speculative_enable_batch_size) == (64, 1)
    switch = SpecSwitch.from_server_args(args)
    assert (switch.disable_batch_size, switch.enable_batch_size) == (8, 6)  # the prior
    args = handled_switch_args(
        tmp_path,
        speculative_disable_batch_size="auto",
        speculative_auto_max_batch_size=4,
        speculative_enable_batch_size="auto",
    )
    assert args.speculative_disable_batch_size == 4
    assert SpecSwitch.from_server_args(args).disable_batch_size == 4
    fixed = handled_switch_args(tmp_path, speculative_disable_batch_size=16)
    assert not fixed.speculative_switch_auto and SpecSwitch.from_server_args(fixed).auto is None


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            {"speculative_disable_batch_size": "auto", "speculative_enable_batch_size": 4},
            "leave --speculative-enable-batch-size out or set it to auto",
        ),
        (
            {"speculative_disable_batch_size": 8, "speculative_enable_batch_size": "auto"},
            "needs --speculative-disable-batch-size auto",
        ),
        (
            {"speculative_disable_batch_size": 8, "speculative_auto_max_batch_size": 32},
            "--speculative-auto-max-batch-size needs --speculative-disable-batch-size auto",
        ),
        ({"speculative_disable_batch_size": "auto", "speculative_auto_max_batch_size": 0}, "must be at least 1, got 0"),
    ],
)
def test_bad_auto_arguments_are_refused(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        handled_switch_args(tmp_path, **overrides)


def test_auto_is_a_command_line_value():
    import argparse

    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    args = parser.parse_args(["--model-path", "m", "--speculative-disable-batch-size", "auto"])
    assert args.speculative_disable_batch_size == "auto"
    with pytest.raises(SystemExit):
        parser.parse_args(["--model-path", "m", "--speculative-disable-batch-size", "many"])


def test_the_step_before_a_catch_up_is_not_a_plain_measurement():
    """Under the overlap scheduler the catch-up's host work is launched inside the interval of the
    plain step before it; that step, the catch-up and the first speculative step do not count."""
    from sglang.srt.speculative.spec_switch_costs import StepCostLearner

    now = [0.0]
    learner = StepCostLearner(64, prior=8, clock=lambda: now[0])
    steps = [(False, 5e-3)] * 6 + [(False, 60e-3), (None, 20e-3), (True, 9e-3)] + [(True, 9e-3)] * 6
    for forward_ct, (speculative, seconds) in enumerate(steps, 1):
        now[0] += seconds
        learner.observe(forward_ct, 30, 40 if speculative else 0, speculative)
    plain, spec = learner.times[(28, False)], learner.times[(28, True)]
    assert plain.samples == 5 and plain.median_seconds == pytest.approx(5e-3)
    assert spec.samples == 5 and spec.median_seconds == pytest.approx(9e-3)
    # Every speculative step counts for the acceptance, timed or not.
    assert learner.acceptance.tokens_per_step == pytest.approx(1 + 40 / 30)


def test_a_buckets_rates_follow_its_newest_steps_between_reads():
    """Each bucket's summary is kept between reads (the decode log reads every bucket): a read
    after new steps must see them, in the bucket they fell in and no other."""
    from sglang.srt.speculative.spec_switch_costs import StepCostLearner, bucket_edges

    now = [0.0]
    learner = StepCostLearner(64, prior=8, clock=lambda: now[0])
    forward_ct = 0

    def plain_steps(batch_size: int, seconds: float, count: int) -> None:
        nonlocal forward_ct
        for _ in range(count):
            now[0] += seconds
            forward_ct += 1
            learner.observe(forward_ct, batch_size, 0, False)

    plain_steps(30, 5e-3, 12)
    plain_steps(12, 4e-3, 12)
    step_time = learner.times[(28, False)]
    assert (step_time.median_seconds, step_time.batch_size, step_time.largest) == (pytest.approx(5e-3), 30, 30)
    plain_steps(31, 9e-3, 40)  # a step is timed once the step after it is in: 39 of them
    assert step_time.median_seconds == pytest.approx(9e-3) and step_time.largest == 31
    assert step_time.batch_size == pytest.approx((11 * 30 + 39 * 31) / 50)
    assert learner.times[(12, False)].median_seconds == pytest.approx(4e-3)
    for batch_size in range(1, 65):
        assert learner.bucket(batch_size) == max(e for e in bucket_edges(64) if e <= batch_size)


def test_one_bucket_on_the_wrong_side_does_not_cancel_the_others():
    """One request's poor acceptance at a batch of 1 made that bucket lose on the H200, which
    turned speculation off at every size while larger batches still gained from it."""
    from sglang.srt.speculative.spec_switch_fit import BucketGain, fit_threshold

    def at(*measured: tuple[float, float]) -> list[BucketGain]:
        return [BucketGain(size, math.floor(size), gain) for size, gain in measured]

    assert 10 <= fit_threshold(at((1, -0.2), (5, 0.3), (10, 0.25), (30, -0.3)), prior=8) < 30
    assert fit_threshold(at((1, -0.2), (5, -0.1)), prior=8) == 0  # where every bucket loses
    # Past the largest batch measured, while every bucket gains: where the last two's trend
    # crosses zero, at most a doubling further; the prior where it reaches further still.
    assert fit_threshold(at((5, 0.3), (10, 0.05)), prior=8) == 11  # the trend crosses at 11.5
    assert fit_threshold(at((5, 0.3), (10, 0.2)), prior=8) == 20  # ... at 40
    assert fit_threshold(at((5, 0.3), (10, 0.3 - 1e-9)), prior=8) == 20  # ... past any float
    assert fit_threshold(at((5, 0.2), (10, 0.3)), prior=8) == 10  # no falling trend: no guess
    assert fit_threshold(at((5, 0.3), (12, 0.2)), prior=32) == 32
    # The trend is the step costs': a drop in acceptance measured at 5 and not yet at 10 does
    # not bend it outwards (the gains alone would cross at 40, past the doubling).
    fresh, stale = math.log(2.0), math.log(2.6)
    drop = [BucketGain(5, 5, fresh - 0.5, 1, fresh), BucketGain(10, 10, stale - 0.8, 1, stale)]
    assert fit_threshold(drop, prior=8) == 14  # where 10's acceptance stops paying: 14.3
    assert fit_threshold([], prior=8) == 8
    # The largest batch measured in the last winning bucket, not its mean, bounds speculation.
    tails = [BucketGain(5, 5, 0.3), BucketGain(29.4, 30, 0.2), BucketGain(40, 41, -0.3)]
    assert fit_threshold(tails, prior=8) >= 30
    assert fit_threshold(tails[:2], prior=8) == 60
    # Weighted by the traffic's steps: a few tail steps losing at 30 do not outweigh 48 winning.
    wave = [BucketGain(5, 5, 0.3, 50), BucketGain(30, 30, -0.1, 10), BucketGain(48, 48, 0.08, 200)]
    assert fit_threshold([*wave, BucketGain(60, 60, -0.2, 5)], prior=8) >= 48
    unweighted = [BucketGain(b.batch_size, b.largest, b.gain) for b in wave]
    assert fit_threshold(unweighted, prior=8) < 30


def test_speculation_surely_pays_where_it_beats_a_smaller_batchs_plain_step():
    """A plain step costs no less at a larger batch, a speculative step no more per request:
    where a bucket's speculative steps beat the plain steps measured at a batch of 1 by 10%, no
    plain step of its own can beat them, nor can one at a larger batch until its speculative
    step, grown with the batch, would stop beating that plain step."""
    from sglang.srt.speculative.spec_switch_costs import SURE_MARGIN, StepCostLearner
    from sglang.srt.speculative.spec_switch_fit import learned_threshold

    now = [0.0]
    learner = StepCostLearner(64, prior=8, clock=lambda: now[0])
    forward_ct = 0

    def steps(batch_size: int, speculative: bool, seconds: float, count: int = 8) -> None:
        nonlocal forward_ct
        forward_ct += 1  # a prefill between: each run is timed on its own
        for _ in range(count):
            now[0] += seconds
            forward_ct += 1
            learner.observe(forward_ct, batch_size, 2 * batch_size if speculative else 0, speculative)

    def spec_seconds(batch_size: int) -> float:  # at 3 tokens a step
        return 8.2e-3 + 2e-4 * batch_size

    def headroom(batch_size: int) -> float:
        return 3 * 5e-3 / spec_seconds(batch_size) / (1 + SURE_MARGIN)

    for batch_size in (2, 4, 16, 24, 32):
        steps(batch_size, True, spec_seconds(batch_size))
    assert learner.surely_speculates_up_to() == 0  # no plain step measured at a batch of 1
    steps(1, True, spec_seconds(1))
    steps(1, False, 5e-3)
    assert headroom(32) < 1 < headroom(24)
    # 3, 5-15 and 17-23 never ran; past 24, up to where its step grown with the batch loses.
    assert learner.surely_speculates_up_to() == math.floor(24 * headroom(24)) == 25
    assert [bucket.lower for bucket in learner.buckets()] == [1]  # the rates /metrics shows
    assert learned_threshold(learner, 8) == 25
    # A bucket's own plain steps, where cheaper than the bound, count: the range ends below it.
    steps(16, False, 3e-3)
    assert learner.surely_speculates_up_to() == math.floor(4 * headroom(4)) == 6
    # The scan goes from a batch of 1: a sure bucket above one that is not does not count.
    learner = StepCostLearner(64, prior=8, clock=lambda: now[0])
    steps(1, True, 30e-3)
    steps(1, False, 5e-3)
    steps(2, True, spec_seconds(2))
    assert learner.surely_speculates_up_to() == 0


def test_a_fresh_h100s_first_buckets_take_the_threshold_past_them():
    """GPU 17's open loop at 4 requests/s had measured buckets 1, 2, 8 and 10 (speculative steps
    1.6-1.7x a plain step's tokens), whose step costs did not worsen from 8 to 10 within the
    noise: the threshold stopped at 10 and batches of 11-14 decoded plain, 16% of the rate's
    steps. By the bounds on step costs speculation surely pays up to 13 (bucket 10's speculative
    step, grown with the batch, against its plain one), and where it speculates it is measured."""
    from sglang.srt.speculative.spec_switch_costs import StepCostLearner
    from sglang.srt.speculative.spec_switch_fit import learned_threshold

    now = [0.0]
    learner = StepCostLearner(64, prior=8, clock=lambda: now[0])
    forward_ct = 0
    # (batch, speculative step, plain step) in seconds, from the rates the server logged.
    measured = [(1, 8.89e-3, 5.99e-3), (2, 8.94e-3, 6.01e-3), (8, 9.36e-3, 5.71e-3), (10, 9.91e-3, 6.22e-3)]
    for batch_size, spec, plain in measured:
        for speculative, seconds in ((True, spec), (False, plain)):
            forward_ct += 1
            for _ in range(8):
                now[0] += seconds
                forward_ct += 1
                # 2.5 tokens a step: 1.5 drafts a request accepted, alternately 1 and 2 at a batch of 1
                accepted = (1 + forward_ct % 2) if batch_size == 1 else 3 * batch_size // 2
                learner.observe(forward_ct, batch_size, accepted if speculative else 0, speculative)
    assert [bucket.lower for bucket in learner.buckets()] == [1, 2, 8, 10]
    assert learned_threshold(learner, 10) == learner.surely_speculates_up_to() == 13


@pytest.mark.parametrize("arrivals_every, bursts", [(None, 1), (45e-3, 2), (5e-3, 1)])
def test_a_first_visit_while_off_probes_speculation_until_it_is_timed(arrivals_every, bursts):
    """Off at a batch of 40, never speculated there, the probe share spent: the first visit
    probes speculation at once. With no prefill between the steps one burst times enough of
    them. With a request every 45 ms (an open loop at 22/s), prefilled before the next step, a
    20-ms speculative step has a prefill on one side or the other most of the time, a 7-ms plain
    one seldom: the plain steps are timed, the burst's are not, and the visit probes again, two
    bursts in all (one before: the bucket stayed unmeasured, the threshold below it, and the
    traffic plain until the 2% share came round). With a prefill before every step neither kind
    is timed: a bucket whose plain steps are not measured is one the traffic passes through (a
    closed-loop wave's tail, 3 steps a batch size), and gets one burst: three in every bucket
    took the threshold learnt at a simulated C=60 to 26-38 in 4 of 24 seeds, against 2."""
    from sglang.srt.speculative.spec_switch_auto import PROBE_STEPS, AutoThreshold

    now = [0.0]
    auto = AutoThreshold(64, clock=lambda: now[0])
    auto.probes.charge(2 * PROBE_STEPS)  # as a probe's catch-up does
    forward_ct, spec_steps, arrival = 0, 0, arrivals_every
    for _ in range(200):
        forward_ct += 1
        if arrival is not None and now[0] >= arrival:
            forward_ct += 1  # the prefill batch
            arrival += arrivals_every
        speculative = auto.mode(40, speculating=False)
        now[0] += 20e-3 if speculative else 7e-3
        auto.learner.observe(forward_ct, 40, 60 if speculative else 0, speculative)
        spec_steps += speculative
    assert spec_steps == bursts * PROBE_STEPS
    assert auto.learner.measured(40, False) == (arrivals_every != 5e-3)
