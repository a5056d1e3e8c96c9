"""The pure core: the per-partition state machine, blocks and tokens, shard routing, records.

Nothing here does IO (no network, files, clocks or randomness) and nothing imports from outside
`sparkapp.core`: every rule that decides what is written where can be property-tested in isolation.
"""
