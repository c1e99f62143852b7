"""What in-process restart and Megatron Bridge's clean-up after an error stand on: an abort of a healthy NCCL process
group returns in seconds. On the H200 (torch 2.11.0, NCCL 2.28.9) neither ever returned (docs/failures.md): this
test isolates the abort from Megatron Bridge and NVRx, one rank, one GPU, as torch's own API does it.

    pytest tests/gpu/test_nccl_abort.py -m gpu          (on a GPU host, from the checkout, with the stack)
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.gpu.conftest import REPO, Run

pytestmark = pytest.mark.gpu

# One rank: an NCCL process group and a subgroup, a collective on each, then the abort of every group and how long it
# took; the same for destroy_process_group in a second process, the ordinary teardown.
RANK = textwrap.dedent(
    """
    import json, os, sys, time, torch, torch.distributed as dist
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
    group = dist.new_group([0])
    for g in (None, group):
        x = torch.ones(1 << 20, device="cuda")
        dist.all_reduce(x, group=g)
    torch.cuda.synchronize()
    started = time.monotonic()
    if sys.argv[1] == "abort":
        dist.distributed_c10d._abort_process_group()
    else:
        dist.destroy_process_group()
    print(json.dumps({"way": sys.argv[1], "seconds": round(time.monotonic() - started, 2)}), flush=True)
    """
)
RETURNS_WITHIN_S = 10.0  # an abort of communicators with no work in flight; torch waits up to the group's timeout


@pytest.mark.parametrize("way", ["abort", "destroy"])
def test_a_healthy_nccl_process_group_is_torn_down_in_seconds(way: str, record, tmp_path):
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29547", "RANK": "0", "WORLD_SIZE": "1",
           "LOCAL_RANK": "0", "NCCL_DEBUG": os.environ.get("NCCL_DEBUG", "WARN")}  # fmt: skip
    try:
        done = subprocess.run(
            [sys.executable, str(script), way],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    except subprocess.TimeoutExpired as stopped:
        record(Run(-1, str(stopped.stderr), 120.0, None, None), way=way, seconds=None, tail=str(stopped.stderr)[-2000:])
        pytest.fail(f"{way} did not return within 120 s")
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    result = json.loads(lines[-1]) if lines else {}
    record(
        Run(done.returncode, done.stderr, 0.0, None, None),
        way=way,
        seconds=result.get("seconds"),
        tail=done.stderr[-2000:],
    )

    assert done.returncode == 0, done.stderr[-3000:]
    assert result["seconds"] < RETURNS_WITHIN_S, result
