"""The byte path's lowest layer: stores and how a read reaches them. `storage` (async
range reads over local files, gs:// and any fsspec filesystem), `backends` (one backend per
kind of store), `gcs/` (the one native gs:// client), `retry`/`hedge` (retries and hedged
attempts), `gate` (a resizable concurrency limit), `reach` (telling an unreachable store
fast), `descriptors` (local file descriptors, capped), `memfile` (memory worker processes
open by path), `sync` (the background event loop sync callers run on)."""
