"""Running the stages over the nodes: selection before work (selection.py), the fan-out helper (fanout.py), and
the pipeline that drives the stages and cleans every node up (pipeline.py)."""
