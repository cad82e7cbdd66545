"""Position → record → byte range: the pure index algorithms (NumPy, no I/O, no state).

`permutation` (keyed Feistel and block shuffles), `sampling` (index ops: shuffle, repeat,
shard, slice), `indexplan` (their validated chain), `blocks` (the block shuffle's resolved
ops), `selection` (mix and concatenate as index arithmetic), `dataslices` (which rows each
JAX process loads), `lanes` (the elastic remap of a stream), `planning` (byte ranges →
merged reads). Everything here is a function of (seed, epoch, position)."""
