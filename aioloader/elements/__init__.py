"""What runs on elements and batches: transforms and their base classes, collation
(batch, pad), columns, packing, typed records and tf.train.Example decoding. Pure: no I/O,
no event loop; the workers and the inline executor run them."""
