"""The run's rendezvous port: 20000-32767, from the CRC-32 (zlib) of its folder's name, so that two runs on one node
differ; the launches that took their ids in the same second differ by how many ids were taken before them. The
folder names are drawn by hypothesis."""

from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.host.job import PORT_BASE, PORT_SPAN, run_port

NAMES = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00/"), min_size=1, max_size=40)


@settings(max_examples=200, deadline=None)
@given(root=NAMES, run=NAMES, taken=st.integers(0, 1000))
def test_a_runs_port_is_below_the_ephemeral_range_and_the_same_at_every_launch(root: str, run: str, taken: int):
    port = run_port(f"/fsx/{root}", run, taken)
    assert PORT_BASE <= int(port) < PORT_BASE + PORT_SPAN <= 32768
    assert run_port(f"/fsx/{root}", run, taken) == port


@settings(max_examples=100, deadline=None)
@given(root=NAMES, run=NAMES, launches=st.integers(2, 64))
def test_launches_that_took_ids_in_the_same_second_get_ports_of_their_own(root: str, run: str, launches: int):
    ports = [run_port(f"/fsx/{root}", run, taken) for taken in range(launches)]
    assert len(set(ports)) == launches
