"""The project's own package: goes into the image with train.py."""

LAYERS = 2
