"""The switch's learned thresholds (0014, `--speculative-disable-batch-size auto`).

The v2 worker takes every decision on real decode batches (SGLang's own prefills), the thresholds
travel as the scheduler sends them (its real recv_requests on the entry rank, its real request
dispatch on every rank), and the learner sees each step as the scheduler reports it. Only the GPU
is simulated: a step's duration comes from a cost model of a GPU-bound target (a fixed part and a
part per request, speculative steps dearer, each request gaining `accept_length` tokens per
speculative step), with multiplicative noise, on a clock of the rank's own.
"""

from __future__ import annotations

import itertools
import logging

import pytest
from switch_sim import CAP, Rank, SimulatedGpu, serve

from switch_helpers import scheduler_metrics_collector_class, v2_env


@pytest.fixture
def rank(tmp_path, monkeypatch):
    return Rank(v2_env(tmp_path, monkeypatch), seed=0, entry=True)


def test_learns_the_crossover_from_the_prior(rank):
    gpu = SimulatedGpu()
    assert 28 < gpu.crossover() < 36  # above the prior of 8
    thresholds = serve([rank], [(1, 300), (5, 300), (10, 600), (30, 600), (50, 600), (20, 600)], gpu)
    assert thresholds[0] == 8  # the prior until a batch leaves it
    assert abs(thresholds[-1] - gpu.crossover()) <= 2, (thresholds, gpu.crossover())


def test_speculation_stops_where_plain_is_faster(rank):
    gpu = SimulatedGpu(accept_length=1.3)  # a draft the traffic does not follow
    assert gpu.crossover() < 1
    thresholds = serve([rank], [(4, 600), (16, 600), (2, 600), (1, 600)], gpu)
    assert thresholds[-1] == 0, thresholds
    tail = rank.kinds[-400:]
    assert tail.count("speculate") <= 0.03 * len(tail)  # probes only


def test_speculation_stays_on_where_it_pays(rank):
    gpu = SimulatedGpu(spec=(5e-3, 1e-4))  # speculation wins up to the cap
    assert gpu.crossover() > CAP
    thresholds = serve([rank], [(5, 300), (12, 600), (24, 600), (40, 600)], gpu)
    assert thresholds[-1] >= 40
    tail = rank.kinds[-400:]
    assert tail.count("plain") <= 0.03 * len(tail)


def test_threshold_follows_acceptance_mid_run(rank):
    """A bucket's acceptance is that of its own speculative steps, which stop where it decodes
    plain: one in the hysteresis band keeps its last (refreshed by probes only) until the
    batch speculates there again, as it does when it grows back from below."""
    good, poor = SimulatedGpu(), SimulatedGpu(accept_length=2.0)
    assert 5 < poor.crossover() < 10 < 20 < good.crossover()
    before = serve([rank], [(10, 600), (30, 600), (20, 600)], good)
    after = serve([rank], [(20, 800), (10, 800), (5, 800)], poor)
    assert rank.kinds[-300:].count("speculate") > 250  # at 5 it still pays
    after += serve([rank], [(10, 800)], poor)
    assert before[-1] >= 20 and abs(after[-1] - poor.crossover()) <= 2, (before, after)
    assert rank.kinds[-300:].count("plain") > 250


def test_no_flapping_at_the_crossover(rank):
    gpu = SimulatedGpu(noise=0.05)
    at = round(gpu.crossover())
    serve([rank], [(at - 10, 600), (at + 10, 600)], gpu)
    changes_before = rank.switch.switches
    serve([rank], [(at, 3000)], gpu)
    # A side change costs a catch-up on the v2 worker: a handful over 3000 steps at most.
    assert rank.switch.switches - changes_before <= 6


def test_probing_is_bounded(rank):
    from sglang.srt.speculative.spec_switch_auto import PROBE_SHARE, PROBE_STEPS

    gpu = SimulatedGpu()
    steps = 6000
    serve([rank], [(60, steps // 2), (2, steps // 2)], gpu)
    probes = rank.switch.auto.probes.probe_steps
    first_visits = rank.switch.auto.first_visit_bursts
    assert len(first_visits) <= 2  # one bucket in each mode: 2 and 56-63
    assert 0 < probes <= PROBE_SHARE * steps + 2 * PROBE_STEPS + PROBE_STEPS * sum(first_visits.values())


def test_probing_spends_a_bounded_share_of_the_time_where_catch_ups_are_dear(tmp_path, monkeypatch, caplog):
    """Above the crossover a probe that speculates first catches the draft up over the positions
    decoded since the last one (up to a prefill chunk: here 4,096 tokens, 20 plain steps' worth).
    Counted as one step, the 2% of the steps took 7.7% of the time at a batch of 50; charged at
    its measured cost, 2.1%. The time is against a server that never speculates."""
    from sglang.srt.speculative.spec_switch import SpecSwitch
    from sglang.srt.speculative.spec_switch_auto import PROBE_SHARE, AutoThreshold

    caplog.set_level(logging.INFO, logger="sglang.srt.speculative.spec_switch_auto")
    gpu = SimulatedGpu(noise=0)
    assert gpu.crossover() < 50
    never = SpecSwitch.learning(AutoThreshold(0))
    ranks = [
        Rank(v2_env(tmp_path / name, monkeypatch), seed=0, entry=True, switch=switch)
        for name, switch in (("never", never), ("auto", None))
    ]
    spent = []
    for rank in ranks:
        serve([rank], [(50, 500)], gpu)  # the first visits' probes
        start = rank.now
        serve([rank], [(50, 6000)], gpu)
        spent.append(rank.now - start)
    assert ranks[1].kinds[-6000:].count("catch-up") >= 2
    assert spent[1] <= (1 + 1.5 * PROBE_SHARE) * spent[0]
    charges = [r.getMessage() for r in caplog.records if "a probe's catch-up took" in r.getMessage()]
    assert len(charges) >= 2 and "plain steps more than a plain step" in charges[-1]


def test_ranks_switch_at_the_same_steps(tmp_path, monkeypatch):
    """Rank 1's clock runs differently (its own noise, a slower host): alone it would learn
    other thresholds; with the entry rank's sent to both, every step is of the same kind."""
    gpu = SimulatedGpu(noise=0.08)
    load = [(1, 200), (5, 300), (12, 500), (30, 500), (18, 800), (24, 800), (48, 1200)]
    ranks = [
        Rank(v2_env(tmp_path / "r0", monkeypatch), seed=0, entry=True),
        Rank(v2_env(tmp_path / "r1", monkeypatch), seed=1, entry=False),
    ]
    serve(ranks, load, gpu)
    assert ranks[0].kinds == ranks[1].kinds
    assert ranks[0].switch.status() == ranks[1].switch.status()
    # What the probes' catch-ups cost is measured on the entry rank and sent with the thresholds,
    # and so is where first visits need no plain probe.
    assert ranks[0].switch.auto.probes.charged == ranks[1].switch.auto.probes.charged > 0
    assert ranks[0].switch.auto.sure_batch_size == ranks[1].switch.auto.sure_batch_size >= 5
    assert "plain" in ranks[0].kinds and "speculate" in ranks[0].kinds

    # Each rank on its own measurements: the decisions part, which the broadcast prevents.
    alone = [Rank(v2_env(tmp_path / f"a{i}", monkeypatch), seed=i, entry=True) for i in range(2)]
    for rank_alone in alone:
        serve([rank_alone], load, gpu)
    assert alone[0].kinds != alone[1].kinds


def test_learned_threshold_and_rates_reach_prometheus(rank):
    from prometheus_client import REGISTRY

    SchedulerMetricsCollector = scheduler_metrics_collector_class()
    from sglang.srt.server_args import get_global_server_args

    serve([rank], [(10, 400), (30, 400)], SimulatedGpu())
    labels = {"model_name": "auto", "engine_type": "unified", "tp_rank": "0", "pp_rank": "0", "moe_ep_rank": "0"}
    before = set(REGISTRY._collector_to_names)
    collector = SchedulerMetricsCollector(labels=labels, server_args=get_global_server_args())
    try:
        collector.log_spec_switch_auto(rank.switch)
        assert REGISTRY.get_sample_value("sglang:spec_switch_threshold", labels) == rank.switch.disable_batch_size
        buckets = rank.switch.auto.learner.buckets()
        assert {b.lower for b in buckets} >= {10, 28}
        for b in buckets:
            spec = REGISTRY.get_sample_value(
                "sglang:spec_switch_tokens_per_second", {**labels, "batch_size": str(b.lower), "mode": "spec"}
            )
            assert spec == pytest.approx(b.spec)
    finally:  # the collector registers SGLang's metrics globally; other tests make their own
        for added in set(REGISTRY._collector_to_names) - before:
            REGISTRY.unregister(added)
    assert "threshold=" in rank.switch.status()


def test_a_new_batch_size_is_measured_at_once(rank):
    """The first visit to a batch size probes the other mode on credit: at C=1 the share was spent
    on plain probes, and a batch of 10, above the prior, must not decode plain for hundreds of
    steps before speculation is tried there."""
    gpu = SimulatedGpu()
    warm_up = [(size, 12) for size in (1, 2, 4, 8, 16, 32, 64)]  # as the benchmark warms a server up
    serve([rank], [*warm_up, (1, 600)], gpu)
    assert serve([rank], [(10, 60)], gpu)[-1] >= 10
    assert rank.kinds[-20:].count("speculate") >= 19


def test_one_poor_request_at_a_batch_of_1_does_not_stop_speculation_for_the_next(rank):
    """On the H200 a request of accept length 1.5-2.0 at C=1 turned speculation off for the
    good requests after it (0.68-0.84 of always speculating at C=1-2): the acceptance is the
    traffic's, over more than one request, not the last request's at that batch size."""
    good, poor = SimulatedGpu(), SimulatedGpu(accept_length=1.6)
    assert poor.crossover() < 1 < good.crossover()
    serve([rank], [(1, 300)], good)
    serve([rank], [(1, 250)], poor)  # one request of 256 tokens
    assert serve([rank], [(1, 300)], good)[-1] >= 1
    assert rank.kinds[-300:].count("speculate") >= 0.95 * 300


def test_a_drop_in_acceptance_is_learnt_where_the_traffic_speculates(rank):
    """Each bucket keeps the acceptance of the requests it served: a drop seen only at a batch of
    5 leaves the threshold above 12 until the traffic comes back to 12, whose first steps then
    speculate on the older figure and learn the new one from their own steps (here within 150,
    at 0.92 of plain; 90-100 over six seeds when the traffic's acceptance weighed as 512 of the
    bucket's request-steps, 100-140 at 48). Too high a figure costs those steps; one too low
    would decode plain until a probe corrected it, at 2% of steps. Meanwhile the threshold does
    not rise (it went 35 -> 56 when the trend past the measured batches took the gains of a
    fresh and a stale acceptance for the step costs')."""
    good, poor = SimulatedGpu(), SimulatedGpu(accept_length=2.0)
    assert 5 < poor.crossover() < 10 < 28 < good.crossover()
    before = serve([rank], [(5, 300), (28, 600), (12, 300)], good)
    small = serve([rank], [(5, 400)], poor)
    assert rank.switch.auto.learner.acceptance.tokens_per_step < 2.2  # the traffic's has fallen
    back = serve([rank], [(12, 10)] * 18, poor)
    assert before[-1] >= 20 and small[-1] >= 12, (before, small)
    learnt_after = 10 * next(i + 1 for i, threshold in enumerate(back) if threshold < 12)
    assert learnt_after <= 150, back
    assert max(back) <= small[-1], back
    assert rank.kinds[-30:].count("speculate") <= 3


def test_a_waves_tail_does_not_lower_the_threshold_of_its_full_batch(rank):
    """The last requests of a closed-loop wave are those that accept least (they take the most
    steps). On the H200 the tails of C=48 (accept length 1.5-2.4 at batches of 1-29, 2.65 at 48)
    took the one acceptance of all batch sizes from 2.64 to 2.25, and the threshold from 48 to
    21 where the run's crossover was 49.7: each bucket's own acceptance keeps 48's."""
    full, tail = SimulatedGpu(accept_length=3.3), SimulatedGpu(accept_length=2.5)
    assert full.crossover() > CAP and 20 < tail.crossover() < 40
    serve([rank], [(10, 300)], full)
    thresholds = []
    for _ in range(5):
        thresholds += serve([rank], [(48, 85)], full)
        # The requests leave one by one: no prefill between, so these steps are timed.
        thresholds += serve([rank], [(size, 8) for size in (44, 36, 28, 20, 12, 6, 2, 1)], tail)
    assert min(thresholds[9:]) >= 48, thresholds
    full_batch_steps = rank.kinds[-85 - 8 * 8 : -8 * 8]
    assert full_batch_steps.count("speculate") >= 80


def test_the_batch_size_that_won_is_kept_when_wave_tails_lower_the_mean(rank):
    """On the H200 at C=30 the bucket 28-31 won, but each wave's tail (29, 28, ...) put its mean
    batch below 30 and the threshold went 30 -> 29 -> 28: the traffic's own batch then decoded
    plain. A bucket that wins speculates up to the largest batch measured in it."""
    gpu = SimulatedGpu(accept_length=3.0)
    assert gpu.crossover() > 40  # at 30 speculation gains past the margin
    serve([rank], [(10, 300)], gpu)
    waves = [(30, 40), (29, 4), (28, 4)] * 5
    thresholds = serve([rank], waves, gpu)
    assert min(thresholds[-6:]) >= 30, thresholds
    assert rank.kinds[-48:].count("speculate") >= 44


def _bench_level(concurrency: int) -> list[tuple[int, int]]:
    """Three closed-loop waves as the benchmark sends them: the full batch, then its tail."""
    wave = [(concurrency, 85), *[(size, 2) for size in range(concurrency - 1, 0, -1)]]
    return wave * 3


def test_a_batch_size_new_after_several_levels_is_measured_at_once(rank):
    """On the H200 the levels C=1..10 and their wave tails spent the credit of first visits, so at
    C=30 the first wave decoded plain for 200 steps (0.79 of always speculating) before speculation
    was tried there. A first visit is a one-off per bucket and mode: it needs no credit."""
    gpu = SimulatedGpu(accept_length=2.8)
    warm_up = [(size, 12) for size in (1, 2, 4, 8, 16, 32, 64)]
    serve([rank], [*warm_up, *(step for c in (1, 2, 5, 10) for step in _bench_level(c))], gpu)
    assert serve([rank], [(30, 60)], gpu)[-1] >= 30
    assert rank.kinds[-20:].count("speculate") >= 19


def test_a_new_batch_size_speculates_as_soon_as_its_first_visit_is_measured(rank):
    """On the H200 C=30 began at the threshold C=10 left: after the first visit's burst the
    threshold waited for the next estimate, every 16 measured steps, and 20 plain steps ran
    before it moved to 30 (two of the level's nine steady intervals, the median's low end). A
    bucket newly measured in a mode is estimated at once: after the burst, the plain steps that
    measure the other side (the first after a change of kind does not count) and no more."""
    from sglang.srt.speculative.spec_switch_costs import MIN_SAMPLES

    gpu = SimulatedGpu(accept_length=2.8)
    serve([rank], [step for c in (1, 2, 5, 10) for step in _bench_level(c)], gpu)
    assert rank.switch.disable_batch_size < 30 < gpu.crossover()
    first = len(rank.kinds)
    serve([rank], [(30, 40)], gpu)
    at_30 = rank.kinds[first:]
    assert at_30[:8].count("speculate") >= 7  # the first visit's burst
    assert at_30.count("plain") <= MIN_SAMPLES + 2, at_30  # 15 when it waited for the estimate


def test_a_sweep_of_closed_loop_levels_keeps_what_clearly_pays(rank):
    """The benchmark's sweep as the H200 served it: levels of three waves, each wave's tail the
    requests that accept least. Speculation gains 11% at C=30 and about nothing at 48 (the
    crossover is 50), and loses 4% at 60: after C=48's tails the threshold must still speculate
    at 30 (the one acceptance for all batch sizes left 25 there) and stay near the crossover
    (the tails' acceptance, weighed as 512 request-steps of the full batch's own, left 37), and
    C=60 must decode plain."""
    from sglang.srt.speculative.spec_switch_auto import PROBE_STEPS

    full = SimulatedGpu(accept_length=2.7, spec=(7e-3, 2.11e-4))
    tail = SimulatedGpu(accept_length=2.2, spec=(7e-3, 2.11e-4))
    assert 48 < full.crossover() < 52 and tail.crossover() < 20
    ends = {}
    for c in (1, 2, 5, 10, 30, 48, 60):
        for _ in range(3):
            serve([rank], [(c, 85)], full)
            sizes = sorted({max(1, c * k // 8) for k in range(1, 8)}, reverse=True)
            serve([rank], [(size, 3) for size in sizes], tail)
        ends[c] = rank.switch.disable_batch_size
    assert ends[30] >= 30 and ends[48] >= full.crossover() - 4 and 30 <= ends[60] < 60, ends
    last_full_batch = rank.kinds[-(85 + 3 * 7) : -3 * 7]
    assert last_full_batch.count("speculate") <= PROBE_STEPS  # a probe burst at most


@pytest.mark.parametrize("seed", range(8))
def test_the_threshold_holds_while_step_costs_drift_with_the_waves(tmp_path, monkeypatch, seed):
    """On the H200 at C=48 the plain steps' median cost followed each wave's context lengths
    (8724-9364 tok/s), and the threshold interpolated between the buckets at 28 and 48 went
    39 -> 42 -> 40 -> 41 ... (25 changes in one level, each logged). Costs that change with the
    phase of every wave are the traffic's mean cost, not a change to follow. Over these seeds
    the threshold still went 41 <-> 43 up to 12 times while it only moved between the batches
    that ran (28 and 48, each decided alike either way)."""
    rank = Rank(v2_env(tmp_path, monkeypatch), seed=seed, entry=True)
    early, late = SimulatedGpu(accept_length=2.8), SimulatedGpu(accept_length=2.8, plain=(4.2e-3, 5.25e-5))
    assert 28 < early.crossover() < late.crossover() < 48
    wave = [(early, [(48, 60)]), (late, [(48, 60), (28, 10)])]
    for gpu, load in wave * 6:
        serve([rank], load, gpu)
    learned = rank.switch.disable_batch_size
    thresholds = []
    for gpu, load in wave * 24:
        thresholds += serve([rank], load, gpu)
    assert 28 <= learned < 48
    changes = sum(before != after for before, after in itertools.pairwise([learned, *thresholds]))
    assert changes <= 2, thresholds
