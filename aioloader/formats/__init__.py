"""Each file format's index and chunk decoding, bytes in and bytes out (no I/O, no asyncio)."""
