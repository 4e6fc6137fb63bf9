"""Build script: pure-Python package; the native-kernel build is added in csrc/ via CMake."""

from setuptools import setup

setup()
