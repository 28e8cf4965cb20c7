"""Package discovery (the rest of the metadata is in pyproject.toml).

setuptools' ``packages.find`` cannot rename a folder, and hetsched installs two top-level folders of
this repository under its own name: ``backends/`` as ``hetsched.backends`` and ``policies/`` as
``hetsched.policies`` (``package-dir`` in pyproject.toml). Every folder with an ``__init__.py`` is
found, so a new subpackage cannot be left out of the wheel (tests/test_packaging.py checks the wheel).
"""

from setuptools import find_packages, setup

MAPPED = ("backends", "policies")

packages = find_packages(include=["hetsched", "hetsched.*"])
for top in MAPPED:
    packages += [f"hetsched.{name}" for name in find_packages(include=[top, f"{top}.*"])]

setup(packages=packages)
