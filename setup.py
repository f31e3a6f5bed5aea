"""Build hook: the wheel ships the runtime and the checking toolkit, not the test suite.

Everything else is in pyproject.toml. The test modules (``test_*.py``) of
model_tests/ and fault_injection/ stay in the clone: many read the clone
itself (pyproject.toml, docs/, benchmarks/), and `shmring check` imports
none of them. An editable install keeps them (the suite runs from the clone).
"""

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildPyWithoutTests(build_py):
    def find_package_modules(self, package: str, package_dir: str) -> list[tuple[str, str, str]]:
        modules = super().find_package_modules(package, package_dir)
        if getattr(self, "editable_mode", False):
            return modules
        return [module for module in modules if not module[1].startswith("test_")]


setup(cmdclass={"build_py": BuildPyWithoutTests})
