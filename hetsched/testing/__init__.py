"""Public test helpers: fake SoC sysfs trees, fake backends."""

from ._boards import BOARD_SOCS, build_board_tree

__all__: list[str] = ["BOARD_SOCS", "build_board_tree"]
