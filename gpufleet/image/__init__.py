"""Container images without a daemon: layers, references, registry credentials, pushes."""
