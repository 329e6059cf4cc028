"""A TensorFlow-layout project: setup.py, run.py."""

from setuptools import setup

setup(name="tf-demo", version="0.1.0", install_requires=["tensorflow==0.0.1"])
