"""What the DeepEP GPU checks compare against, on CPU: the routing's expected arrivals, the pass/fail of a round,
and the loss agreement of the training test (the GPU parts themselves run in tests/gpu/test_deepep.py)."""

import argparse

import torch

from tests.gpu import deepep_dispatch as check
from tests.gpu.conftest import Run
from tests.gpu.test_deepep import loss_agreement


def test_arrivals_count_each_token_once_per_rank_and_once_per_local_expert():
    # 2 ranks, 4 experts: rank 1 holds experts 2 and 3.
    rank0 = torch.tensor([[0, 2], [1, 0], [3, 2]])
    rank1 = torch.tensor([[2, 3], [0, 1]])
    assert check.expected_arrivals([rank0, rank1], rank=1, experts=4) == (3, [3, 2])
    assert check.expected_arrivals([rank0, rank1], rank=0, experts=4) == (3, [3, 2])


def test_routing_gives_distinct_experts_and_float32_probabilities():
    indices, probs = check.routing(tokens=64, experts=16, topk=4, seed=0)
    assert indices.dtype == torch.int64 and probs.dtype == torch.float32
    assert all(len(set(row.tolist())) == 4 for row in indices)


def good_round(**changes) -> dict:
    checks = {"received_tokens": (10, 10), "tokens_per_expert": ([4, 6], [4, 6]), "combined_error": 0.004,
              "grad_x_error": 0.004, "grad_probs_error": 1e-5, "seconds": 0.5}  # fmt: skip
    return {**checks, **changes}


def test_a_round_fails_on_any_count_off_or_any_error_past_the_tolerance():
    args = argparse.Namespace(ranks=2, tokens=1024, hidden=512, experts=16, topk=4)
    bad = [good_round(tokens_per_expert=([4, 5], [4, 6])), good_round(grad_x_error=3 * check.TOLERANCE)]
    result = check.summary(args, [[good_round()], bad])
    assert [row["ok"] for row in result["rows"]] == [True, False, False]
    assert result["ok"] is False
    table = check.markdown(result)
    assert table.count("| NO |") == 2 and "All checks pass: NO." in table
    assert check.summary(args, [[good_round()], [good_round()]])["ok"] is True


def runs_with(losses: list[float]) -> Run:
    return Run(0, "", 0.0, None, None, losses=dict(enumerate(losses, start=1)))


def test_loss_agreement_takes_the_larger_of_three_times_the_noise_and_one_percent():
    alltoall = [runs_with([10.0, 8.0, 6.0]), runs_with([10.0, 8.1, 6.0])]
    close = [runs_with([10.0, 8.25, 6.05]), runs_with([10.0, 8.25, 6.05])]  # step 2: 0.2 off, noise 0.1
    apart = [runs_with([10.0, 8.02, 6.5]), runs_with([10.0, 8.02, 6.5])]
    within = loss_agreement({"alltoall": alltoall, "deepep": close})
    assert within["steps"] == 3
    assert within["worst"]["difference"] <= within["worst"]["tolerance"]
    outside = loss_agreement({"alltoall": alltoall, "deepep": apart})["worst"]
    assert outside["step"] == 3 and outside["difference"] > outside["tolerance"] == 0.06
