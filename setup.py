"""The package list, found from the folders: a new `targets/<framework>/` or `oracles/kinds/<kind>/` folder
is installed without an edit here or in pyproject.toml (which holds everything else)."""

from setuptools import find_packages, setup

ROOTS = ("oracles", "fuzz", "targets")  # installed as maskfuzz.oracles, maskfuzz.fuzz, maskfuzz.targets

packages = [f"maskfuzz.{p}" for p in find_packages(include=[f"{r}*" for r in ROOTS])]
setup(packages=packages, package_dir={f"maskfuzz.{r}": r for r in ROOTS})
