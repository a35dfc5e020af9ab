"""Programs that run on the nodes under torchrun: standard library and torch only, uploaded as single files."""
