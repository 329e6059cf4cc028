"""A training project as `gpufleet run` sees it: detection, settings, the image it becomes."""
