"""The description of a pipeline and its compilation, pure and picklable: `Dataset`
(`dataset`), its source and mix specs (`description`, `objects`, `mixed`), the compiled
`Plan` (`plan`) and the stream position (`state`). Nothing here starts a thread, a process or
an event loop; the Dataset starts its runtime lazily from inside its methods (`loader()`,
`ds[i]`, `graph()`), the one edge up the layers."""
