"""Device specs and CPU cluster discovery from fake sysfs trees."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest

from hetsched import Device, DeviceSpecError, discover_cpu_clusters, resolve_devices
from hetsched._devices.resolve import format_cpulist, parse_cpulist

ALL8 = list(range(8))


def _write(root: Path, files: Mapping[str, str]) -> Path:
    for rel, text in files.items():
        p = root / "sys/devices/system/cpu" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text + "\n")
    return root


def _rk3588(root: Path) -> Path:
    """RK3588: 4x A55 (policy0, capacity 414, 1.8 GHz) + 2x2 A76 (policy4/6, 1024, 2.352/2.4 GHz)."""
    files = {"online": "0-7", "possible": "0-7"}
    for pol, cpus, cap, fmax in ((0, "0-3", 414, 1800000), (4, "4-5", 1024, 2352000), (6, "6-7", 1024, 2352000)):
        files[f"cpufreq/policy{pol}/related_cpus"] = " ".join(str(c) for c in parse_cpulist(cpus))
        files[f"cpufreq/policy{pol}/affected_cpus"] = files[f"cpufreq/policy{pol}/related_cpus"]
        files[f"cpufreq/policy{pol}/cpuinfo_max_freq"] = str(fmax)
        files[f"cpufreq/policy{pol}/cpuinfo_min_freq"] = "408000"
        for c in parse_cpulist(cpus):
            files[f"cpu{c}/cpu_capacity"] = str(cap)
            files[f"cpu{c}/topology/cluster_id"] = str(pol // 4)
    return _write(root, files)


# -- spec parsing ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "cpus"), [
    ("0", (0,)), ("0-3", (0, 1, 2, 3)), ("4,5", (4, 5)), ("0-1,4 6", (0, 1, 4, 6)), ("3,1,1", (1, 3)), ("", ()),
])
def test_parse_cpulist(text: str, cpus: tuple[int, ...]) -> None:
    assert parse_cpulist(text) == cpus


@pytest.mark.parametrize("text", ["a", "1-", "3-1", "0-1-2", "-1", "1.5"])
def test_parse_cpulist_rejects_garbage(text: str) -> None:
    with pytest.raises(DeviceSpecError, match="bad CPU list"):
        parse_cpulist(text)


def test_format_cpulist_round_trips() -> None:
    assert format_cpulist([0, 1, 2, 4, 6, 7]) == "0-2,4,6-7"
    assert parse_cpulist(format_cpulist([0, 1, 2, 4, 6, 7])) == (0, 1, 2, 4, 6, 7)


@pytest.mark.parametrize(("spec", "name", "cpus"), [
    ("cpu:0", "cpu:0", (0,)),
    ("cpu:0-1", "cpu:0-1", (0, 1)),
    ("cpu:4,5", "cpu:4-5", (4, 5)),
    (" CPU:6,7 ", "cpu:6-7", (6, 7)),
    ("cpu:1,3", "cpu:1,3", (1, 3)),
])
def test_cpu_specs(tmp_path: Path, spec: str, name: str, cpus: tuple[int, ...]) -> None:
    (dev,) = resolve_devices([spec], root=tmp_path, available_cpus=ALL8)
    assert (dev.name, dev.cpus, dev.kind, dev.backend) == (name, cpus, "cpu", "cpu")
    assert dev.peak_flops > 0 and dev.mem_bandwidth > 0


def test_single_string_and_device_objects_pass_through(tmp_path: Path) -> None:
    custom = Device("npu0", kind="npu", backend="sim")
    devs = resolve_devices(["cpu:0", custom], root=tmp_path, available_cpus=[0])
    assert devs[1] is custom
    assert [d.name for d in resolve_devices("cpu:0", root=tmp_path, available_cpus=[0])] == ["cpu:0"]


def test_cpu_spec_means_all_usable_cpus(tmp_path: Path) -> None:
    (dev,) = resolve_devices("cpu", root=tmp_path, available_cpus=[0, 1, 2])
    assert dev.cpus == (0, 1, 2) and dev.name == "cpu:0-2"


@pytest.mark.parametrize(("spec", "message"), [
    ("gpu:0", "device spec 'gpu:0': no Jetson Orin under"),
    ("cpu:x", "device spec 'cpu:x': bad CPU list"),
    ("cpu:3-1", "device spec 'cpu:3-1': .*runs backwards"),
    ("cpu:", "names no CPUs"),
    ("bigg", "unknown device spec"),
])
def test_bad_specs(tmp_path: Path, spec: str, message: str) -> None:
    with pytest.raises(DeviceSpecError, match=message):
        resolve_devices([spec], root=tmp_path, available_cpus=ALL8)


def test_cpus_the_host_lacks(tmp_path: Path) -> None:
    with pytest.raises(DeviceSpecError, match=r"'cpu:1-3' names CPUs \[2, 3\] that this host/process lacks"):
        resolve_devices(["cpu:1-3"], root=tmp_path, available_cpus=[0, 1])


def test_cpus_this_real_host_lacks() -> None:
    import os

    missing = max(os.sched_getaffinity(0)) + 1
    with pytest.raises(DeviceSpecError, match=rf"\[{missing}\]"):
        resolve_devices([f"cpu:{missing}"])


def test_duplicates_and_empty(tmp_path: Path) -> None:
    with pytest.raises(DeviceSpecError, match=r"duplicate devices: \['cpu:0-1'\]"):
        resolve_devices(["cpu:0-1", "cpu:0,1"], root=tmp_path, available_cpus=ALL8)
    with pytest.raises(DeviceSpecError, match="no devices"):
        resolve_devices([], root=tmp_path, available_cpus=ALL8)
    with pytest.raises(DeviceSpecError, match="string or Device"):
        resolve_devices([3], root=tmp_path, available_cpus=ALL8)  # type: ignore[list-item]


# -- cluster discovery -----------------------------------------------------------------------------


def test_rk3588_clusters_from_cpufreq_policies(tmp_path: Path) -> None:
    clusters = discover_cpu_clusters(_rk3588(tmp_path))
    assert [(c.policy, c.cpus, c.capacity, c.max_freq_khz, c.role) for c in clusters] == [
        (0, (0, 1, 2, 3), 414.0, 1800000, "little"),
        (4, (4, 5), 1024.0, 2352000, "big"),
        (6, (6, 7), 1024.0, 2352000, "big"),
    ]
    assert [c.domain for c in clusters] == ["cluster0", "cluster4", "cluster6"]


def test_rk3588_big_little_specs(tmp_path: Path) -> None:
    root = _rk3588(tmp_path)
    big = resolve_devices(["big"], root=root, available_cpus=ALL8)
    assert [(d.name, d.domain, d.options["role"]) for d in big] == [
        ("cpu:4-5", "cluster4", "big"), ("cpu:6-7", "cluster6", "big")]
    (little,) = resolve_devices(["little"], root=root, available_cpus=ALL8)
    assert (little.name, little.domain, little.capacity) == ("cpu:0-3", "cluster0", 414.0)
    # Per core, a big core is faster than a little one in the analytic model.
    assert big[0].peak_flops / 2 > little.peak_flops / 4
    everything = resolve_devices(None, root=root, available_cpus=ALL8)
    assert [d.name for d in everything] == ["cpu:0-3", "cpu:4-5", "cpu:6-7"]
    with pytest.raises(DeviceSpecError, match="no mid CPU cluster"):
        resolve_devices(["mid"], root=root, available_cpus=ALL8)


def test_pinned_specs_take_their_clusters_properties(tmp_path: Path) -> None:
    root = _rk3588(tmp_path)
    a76, a55, mixed = resolve_devices(["cpu:4,5", "cpu:1", "cpu:3-4"], root=root, available_cpus=ALL8)
    assert (a76.domain, a76.capacity, a76.max_freq_khz) == ("cluster4", 1024.0, 2352000)
    assert (a55.domain, a55.capacity, a55.max_freq_khz) == ("cluster0", 414.0, 1800000)
    assert mixed.domain is None  # spans two clock domains


def test_clusters_the_process_cannot_use(tmp_path: Path) -> None:
    with pytest.raises(DeviceSpecError, match=r"cluster cpu:4-5 has CPUs \[4, 5\]"):
        resolve_devices(["big"], root=_rk3588(tmp_path), available_cpus=[0, 1, 2, 3])


def test_offline_cpus_are_left_out(tmp_path: Path) -> None:
    root = _rk3588(tmp_path)
    (root / "sys/devices/system/cpu/online").write_text("0-4\n")
    clusters = discover_cpu_clusters(root)
    assert [c.cpus for c in clusters] == [(0, 1, 2, 3), (4,)]  # policy6 fully offline: gone


def test_tree_without_cpufreq_uses_topology_cluster_id(tmp_path: Path) -> None:
    files = {"online": "0-5"}
    for c in range(6):
        files[f"cpu{c}/topology/cluster_id"] = "0" if c < 4 else "1"
        files[f"cpu{c}/cpu_capacity"] = "446" if c < 4 else "1024"
    clusters = discover_cpu_clusters(_write(tmp_path, files))
    assert [(c.policy, c.cpus, c.capacity, c.role) for c in clusters] == [
        (None, (0, 1, 2, 3), 446.0, "little"), (None, (4, 5), 1024.0, "big")]
    assert clusters[0].domain is None


def test_three_tiers_rank_little_mid_big(tmp_path: Path) -> None:
    files = {"online": "0-7"}
    for pol, cpus, cap, fmax in ((0, "0 1 2 3", 325, 2000000), (4, "4 5 6", 825, 2850000), (7, "7", 1024, 3050000)):
        files[f"cpufreq/policy{pol}/related_cpus"] = cpus
        files[f"cpufreq/policy{pol}/cpuinfo_max_freq"] = str(fmax)
        for c in cpus.split():
            files[f"cpu{c}/cpu_capacity"] = str(cap)
    clusters = discover_cpu_clusters(_write(tmp_path, files))
    assert [c.role for c in clusters] == ["little", "mid", "big"]


def test_same_capacity_ranked_by_max_frequency(tmp_path: Path) -> None:
    files = {"online": "0-3"}
    for pol, cpus, fmax in ((0, "0 1", 1800000), (2, "2 3", 2400000)):
        files[f"cpufreq/policy{pol}/related_cpus"] = cpus
        files[f"cpufreq/policy{pol}/cpuinfo_max_freq"] = str(fmax)
    clusters = discover_cpu_clusters(_write(tmp_path, files))
    assert [(c.cpus, c.role, c.capacity) for c in clusters] == [((0, 1), "little", 1024.0),
                                                               ((2, 3), "big", 1024.0)]


def test_homogeneous_host_has_one_cluster_that_is_big_and_little(tmp_path: Path) -> None:
    root = _write(tmp_path, {"online": "0-3"})
    (cluster,) = discover_cpu_clusters(root)
    assert (cluster.cpus, cluster.role, cluster.policy) == ((0, 1, 2, 3), "cpu", None)
    assert [d.name for d in resolve_devices(["big"], root=root, available_cpus=[0, 1, 2, 3])] == ["cpu:0-3"]
    assert [d.name for d in resolve_devices(["little"], root=root, available_cpus=[0, 1, 2, 3])] == ["cpu:0-3"]


def test_empty_tree_has_no_clusters(tmp_path: Path) -> None:
    assert discover_cpu_clusters(tmp_path) == []
    with pytest.raises(DeviceSpecError, match="no clusters CPU cluster"):
        resolve_devices(["clusters"], root=tmp_path, available_cpus=ALL8)
    # Pinned specs still work: discovery is only used to refine them.
    (dev,) = resolve_devices(["cpu:0"], root=tmp_path, available_cpus=ALL8)
    assert dev.domain is None and dev.capacity == 1024.0


def test_unreadable_and_garbage_files_are_absent_capabilities(tmp_path: Path) -> None:
    root = _write(tmp_path, {
        "online": "0-1",
        "cpufreq/policy0/related_cpus": "0 1",
        "cpufreq/policy0/cpuinfo_max_freq": "<unknown>",
        "cpu0/cpu_capacity": "n/a",
    })
    (cluster,) = discover_cpu_clusters(root)
    assert (cluster.cpus, cluster.capacity, cluster.max_freq_khz) == ((0, 1), 1024.0, None)


def test_real_host_root_falls_back_to_online_cpus() -> None:
    import os

    clusters = discover_cpu_clusters("/")
    cpus = [c for cl in clusters for c in cl.cpus]
    assert cpus, "the host must have at least one cluster"
    assert len(cpus) == len(set(cpus)), "clusters must not overlap"
    assert set(os.sched_getaffinity(0)) <= set(cpus)


# -- RK3588 NPU devices --------------------------------------------------------------------

NPU_MASKS = {"npu": 0, "npu:0": 1, "npu:1": 2, "npu:2": 4, "npu:0-1": 3, "npu:0-2": 7}


@pytest.fixture(scope="module")
def rk3588_twin_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from hetsched.testing import build_board_tree

    return build_board_tree(tmp_path_factory.mktemp("rk3588"), "rk3588")


@pytest.mark.parametrize(("spec", "mask"), sorted(NPU_MASKS.items()))
def test_npu_specs_on_an_rk3588_root(rk3588_twin_root: Path, spec: str, mask: int) -> None:
    (dev,) = resolve_devices([spec], root=rk3588_twin_root)
    assert (dev.name, dev.kind, dev.backend, dev.memory_domain) == (spec, "npu", "rknn", "host")
    assert dev.options["core_mask"] == mask and dev.options["target"] == "rk3588"
    # a twin's root: the twin's NPU domain models the stage's time
    assert dev.options["profile_domain"].name == "npu" and callable(dev.options["clock"])
    assert dev.max_freq_khz is not None and dev.max_freq_khz > 0


def test_npu_specs_mix_with_cpu_specs(rk3588_twin_root: Path) -> None:
    devs = resolve_devices(["cpu:0", "npu:0", "npu:1"], root=rk3588_twin_root, available_cpus=[0, 1])
    assert [d.name for d in devs] == ["cpu:0", "npu:0", "npu:1"]
    assert [d.backend for d in devs] == ["cpu", "rknn", "rknn"]
    with pytest.raises(DeviceSpecError, match="duplicate"):
        resolve_devices(["npu", "npu"], root=rk3588_twin_root)


@pytest.mark.parametrize("board", [None, "orin-nx"])
def test_no_npu_under_the_root_says_what_was_looked_for(tmp_path: Path, board: str | None) -> None:
    if board is not None:
        from hetsched.testing import build_board_tree

        build_board_tree(tmp_path, board)
    else:
        _rk3588(tmp_path)  # CPU clusters only: no devfreq NPU, no rknpu driver
    with pytest.raises(DeviceSpecError) as e:
        resolve_devices(["npu:0"], root=tmp_path)
    msg = str(e.value)
    assert "no NPU found under" in msg and str(tmp_path) in msg
    assert "sys/class/devfreq" in msg and "rknpu" in msg


def test_no_npu_on_this_host() -> None:
    from hetsched._platform import SysfsRoot, devfreq

    if any(d.kind == "npu" for d in devfreq.read_devices(SysfsRoot("/"))):
        pytest.skip("this host has an NPU")
    with pytest.raises(DeviceSpecError, match="no NPU found under '/'"):
        resolve_devices(["npu"], root="/")
