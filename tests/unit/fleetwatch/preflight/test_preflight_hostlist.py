import shutil
import subprocess
import tracemalloc

import pytest

from fleetwatch.preflight.hostlist import MAX_HOSTS, HostlistError, expand

KNOWN = [f"gpu-{i:02d}" for i in range(1, 17)] + ["cpu-1", "cpu-2"]


def test_all_is_every_known_node_in_order():
    assert expand("all", KNOWN) == KNOWN
    assert expand("  all ", ["b", "a"]) == ["b", "a"]


def test_comma_and_space_separated_names():
    assert expand("gpu-03,cpu-1 gpu-01", KNOWN) == ["gpu-03", "cpu-1", "gpu-01"]


def test_slurm_ranges_keep_zero_padding():
    assert expand("gpu-[01-04,07],cpu-1", KNOWN) == [
        "gpu-01",
        "gpu-02",
        "gpu-03",
        "gpu-04",
        "gpu-07",
        "cpu-1",
    ]
    assert expand("gpu-[01-16]", KNOWN) == KNOWN[:16]


def test_padding_follows_the_lower_bound_as_slurm_does():
    names = [f"n{i}" for i in range(1, 12)] + ["n01", "n02"]
    assert expand("n[9-011]", names) == ["n9", "n10", "n11"]
    assert expand("n[01-2]", names) == ["n01", "n02"]


def test_several_bracket_groups_expand_to_their_product():
    known = [f"rack{r}-gpu{g}" for r in (1, 2) for g in (1, 2, 3)]
    assert expand("rack[1-2]-gpu[1,3]", known) == [
        "rack1-gpu1",
        "rack1-gpu3",
        "rack2-gpu1",
        "rack2-gpu3",
    ]


def test_a_name_listed_twice_comes_once():
    assert expand("gpu-[01-02],gpu-01", KNOWN) == ["gpu-01", "gpu-02"]


def test_unknown_names_are_refused_and_named():
    with pytest.raises(HostlistError, match=r"unknown nodes gpu-17, gpu-18 \(18 nodes known\)"):
        expand("gpu-[15-18]", KNOWN)
    with pytest.raises(HostlistError, match=r"unknown node gpu-1 \(18 nodes known\)"):
        expand("gpu-1", KNOWN)


def test_many_unknown_names_are_cut_short():
    with pytest.raises(HostlistError, match="and 92 more"):
        expand("x[1-100]", KNOWN)


@pytest.mark.parametrize(
    ("expr", "problem"),
    [
        ("", "names no nodes"),
        (" , ,", "names no nodes"),
        ("gpu-[3-1]", "range 3-1 goes backwards"),
        ("gpu-[a-b]", "'a-b' is not a number or a range"),
        ("gpu-[]", "'' is not a number"),
        ("gpu-[1-2-3]", "'1-2-3' is not a number"),
        ("gpu-[01-02", "never closed"),
        ("gpu-01]", "']' without '\\['"),
        ("gpu-[0[1]]", "'\\[' inside brackets"),
        ("gpu;rm", "only letters, digits"),
    ],
)
def test_bad_syntax_says_what_is_wrong(expr, problem):
    with pytest.raises(HostlistError, match=problem):
        expand(expr, KNOWN)


def test_all_with_no_known_nodes_is_an_error():
    with pytest.raises(HostlistError, match="no nodes are known"):
        expand("all", [])


@pytest.mark.parametrize(
    "expr",
    [
        "n[0-99999999]",  # one huge range
        "n[0-999][0-999]",  # a product of small ones
        ",".join(f"a{i}-[0-999]" for i in range(70)),  # many terms that add up
        "n" + "[0-9]" * 40,  # stacked groups: 10**40 names
    ],
)
def test_hostile_expansions_are_refused_before_building(expr):
    with pytest.raises(HostlistError, match=f"more than {MAX_HOSTS} names"):
        expand(expr, KNOWN)


@pytest.mark.parametrize(
    "expr",
    [
        "n[" + ",".join(["0-60000"] * 300) + "]",  # 2.4 KB: each range fits, the group does not
        "n[0-60000]-[" + ",".join(["0-1"] * 2) + "]",  # a product just past the cap
    ],
    ids=["ranges-in-one-group", "product"],
)
def test_names_are_counted_before_any_is_built(expr):
    """A short expression that stands for millions of names costs no memory to refuse."""
    tracemalloc.start()
    try:
        with pytest.raises(HostlistError, match=f"more than {MAX_HOSTS} names"):
            expand(expr, KNOWN)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1_000_000  # bytes; 19.7 M names built first took 1.35 GiB


def test_a_huge_expression_is_refused():
    with pytest.raises(HostlistError, match="characters long"):
        expand("a," * 40_000, KNOWN)


# Expressions both we and `scontrol show hostnames` accept: the same names in the same order
# (Slurm keeps repeats; we keep the first of each, so none repeat here).
SLURM_CASES = [
    "gpu-[01-03,07],cpu-1",
    "a[1-2]b[3-4]",
    "n[1-2]-[5-6]",
    "rack[1-2]-gpu[1-2]",
    "gpu-[8-11]",
    "gpu-[08-11]",
    "gpu-[9-011]",
    "x[01-3]",
    "x[0-1]y[00-01]",
    "x[001-100]",
    "gpu-[1-2],gpu-[5-6] c",
]


@pytest.fixture(scope="module")
def slurm_env(tmp_path_factory):
    scontrol = shutil.which("scontrol", path="/usr/bin:/usr/sbin:/bin:/sbin")
    if scontrol is None:
        pytest.skip("scontrol is not installed (scripts/ensure-test-deps.sh installs slurm-wlm)")
    conf = tmp_path_factory.mktemp("slurm") / "slurm.conf"
    # `show hostnames` parses locally; it only needs some configuration to start.
    conf.write_text(
        "ClusterName=hostlist\nSlurmctldHost=localhost\nNodeName=n1\nPartitionName=p Nodes=n1\n"
    )
    return scontrol, {"SLURM_CONF": str(conf), "PATH": "/usr/bin:/bin"}


@pytest.mark.parametrize("expr", SLURM_CASES)
def test_expansion_matches_scontrol(slurm_env, expr):
    scontrol, env = slurm_env
    done = subprocess.run(
        [scontrol, "show", "hostnames", expr],
        capture_output=True,
        text=True,
        env=env,
        check=True,
        timeout=30,
    )
    slurm_names = done.stdout.split()
    assert slurm_names
    assert expand(expr, slurm_names) == slurm_names


@pytest.mark.parametrize("expr", ["gpu-[3-1]", "gpu-[a-b]", "gpu-[]", "gpu-[1-2-3]"])
def test_what_scontrol_refuses_we_refuse(slurm_env, expr):
    scontrol, env = slurm_env
    done = subprocess.run(
        [scontrol, "show", "hostnames", expr],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=30,
    )
    # scontrol prints "Invalid hostlist" and nothing on stdout (its exit status stays 0).
    assert "Invalid hostlist" in done.stderr + done.stdout
    assert not done.stdout.strip()
    with pytest.raises(HostlistError):
        expand(expr, KNOWN)
