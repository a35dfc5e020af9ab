"""What clustercheck knows about a node: the collector's raw output parsed once into a typed record.

`model` holds the record (NodeFacts: None in a field means "could not collect", with the reason in `missing`),
`parse` the pure parsers of raw outputs, `collect` the function that turns the collector's JSON into the record.
"""
