"""The run's rendezvous port comes from POSIX cksum of its folder's name, as srun.sh's bash took it: the launcher's
own CRC is compared with the cksum program on bytes hypothesis draws."""

import subprocess

from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.host.job import cksum


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=600))
def test_cksum_is_posix_cksum(data: bytes):
    out = subprocess.run(["cksum"], input=data, capture_output=True, check=True).stdout
    assert cksum(data) == int(out.split()[0])
