"""CostTable.save/load: a saved table comes back; what is not a regular file is refused unread."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hetsched._errors import NotRegularFileError, ProfileError
from hetsched._planning.costs import CostTable


def test_a_saved_table_loads_back(tmp_path: Path) -> None:
    table = CostTable(smoothing=0.2)
    table.update("a..b#2", "cpu:0", 1e-3, analytic_s=5e-4)
    path = tmp_path / "costs.json"
    table.save(path)
    back = CostTable.load(path)
    assert back.get("a..b#2", "cpu:0") == pytest.approx(1e-3)
    assert back.factor("cpu:0") == pytest.approx(2.0)
    assert back.smoothing == pytest.approx(0.2)


def test_a_directory_is_refused_as_not_a_regular_file(tmp_path: Path) -> None:
    (tmp_path / "costs.json").mkdir()
    with pytest.raises(ProfileError, match=r"costs\.json") as info:
        CostTable.load(tmp_path / "costs.json")
    assert isinstance(info.value.__cause__, NotRegularFileError)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_a_fifo_is_refused_before_it_is_read(tmp_path: Path) -> None:
    # A plain read_text() blocks forever on a FIFO nobody writes to.
    fifo = tmp_path / "costs.json"
    os.mkfifo(fifo)
    with pytest.raises(ProfileError, match=r"costs\.json") as info:
        CostTable.load(fifo)
    assert isinstance(info.value.__cause__, NotRegularFileError)


def test_a_link_to_a_device_is_refused(tmp_path: Path) -> None:
    if not Path("/dev/zero").exists():
        pytest.skip("no /dev/zero on this platform")
    link = tmp_path / "costs.json"
    link.symlink_to("/dev/zero")
    with pytest.raises(ProfileError) as info:
        CostTable.load(link)
    assert isinstance(info.value.__cause__, NotRegularFileError)


def test_binary_content_is_a_profile_error(tmp_path: Path) -> None:
    path = tmp_path / "costs.json"
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ProfileError, match="could not be read"):
        CostTable.load(path)
