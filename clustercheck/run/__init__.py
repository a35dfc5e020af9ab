"""Running the stages over the nodes: the pipeline that drives them and cleans every node up (pipeline.py)."""
