"""tests/gpu/megatron_log.py, as the GPU suite reads its runs, on a real run's log (Llama 3 8B, BF16, 2 x H200,
megatron-bridge 0.6.2): iteration 1-3 and the first memory line as printed; the second memory line shortened to the
run's peak, iteration 4 made up with a nan."""

import pytest

from tests.gpu import megatron_log

LOG = """\
1:  [2026-11-30 10:41:12] iteration        1/       7 | consumed samples:           16 | elapsed time per iteration (ms): 15159.9 | throughput per GPU (TFLOP/s/GPU): 212.3 | learning rate: 4.324324E-05 | global batch size:    16 | lm loss: 1.119590E+01 | loss scale: 1.0 | grad norm: 14.428 | num zeros: 0 | number of skipped iterations:   0 | number of nan iterations:   0 |
0: [Rank 0] (after 1 iterations) memory (GB) | mem-allocated-gigabytes: 73.929 | mem-active-gigabytes: 73.929 | mem-inactive-gigabytes: 3.9907 | mem-reserved-gigabytes: 78.868 | mem-max-allocated-gigabytes: 73.929 | mem-max-active-gigabytes: 73.929 | mem-max-inactive-gigabytes: 4.2948 | mem-max-reserved-gigabytes: 78.868 | mem-alloc-retires: 0 | mem-allocated-count: 570
1:  [2026-11-30 10:41:18] iteration        2/       7 | consumed samples:           32 | elapsed time per iteration (ms): 6163.1 | throughput per GPU (TFLOP/s/GPU): 522.2 | learning rate: 8.648649E-05 | global batch size:    16 | lm loss: 1.119149E+01 | loss scale: 1.0 | grad norm: 14.153 | num zeros: 0 | number of skipped iterations:   0 | number of nan iterations:   0 |
0: [Rank 0] (after 2 iterations) memory (GB) | mem-allocated-gigabytes: 74.1 | mem-max-allocated-gigabytes: 98.095 | mem-max-reserved-gigabytes: 101.2
1:  [2026-11-30 10:41:24] iteration        3/       7 | consumed samples:           48 | elapsed time per iteration (ms): 6167.0 | throughput per GPU (TFLOP/s/GPU): 521.8 | learning rate: 1.297297E-04 | global batch size:    16 | lm loss: 5.213937E+00 | loss scale: 1.0 | grad norm: 13.806 | num zeros: 0 | number of skipped iterations:   0 | number of nan iterations:   0 |
1:  [2026-11-30 10:41:30] iteration        4/       7 | consumed samples:           64 | elapsed time per iteration (ms): 6170.0 | throughput per GPU (TFLOP/s/GPU): 521.5 | lm loss: nan |
"""  # noqa: E501


def test_every_iteration_line_gives_its_step_time_and_loss():
    log = megatron_log.parse(LOG)
    assert log.step_ms == {1: 15159.9, 2: 6163.1, 3: 6167.0, 4: 6170.0}
    assert log.losses[1] == pytest.approx(11.1959)
    assert log.losses[3] == pytest.approx(5.213937)
    assert log.losses[4] != log.losses[4]  # nan is kept, so a test can see it


def test_peak_memory_is_the_largest_max_allocated_not_reserved():
    assert megatron_log.parse(LOG).peak_mem_gb == 98.095


def test_medians_leave_out_the_warm_up_steps():
    log = megatron_log.parse(LOG)
    assert megatron_log.steady_median(log.step_ms, megatron_log.WARMUP_STEPS) == pytest.approx((6167.0 + 6170.0) / 2)


def test_a_log_without_iterations_has_no_medians():
    log = megatron_log.parse("rank 0 exited before training\n")
    assert megatron_log.steady_median(log.step_ms, megatron_log.WARMUP_STEPS) is None
    assert (log.step_ms, log.losses, log.peak_mem_gb) == ({}, {}, None)
