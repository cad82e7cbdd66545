"""The running pipeline on the event loop: the loader facade, the scheduler of the ordered
window of tasks, stream-mode assembly, and the stage figures. Above `workers` (which execute)
and `source` (which locates and fetches); below nothing but `jax` and the public names.
`warmup`: `aioloader.warm_up()`, which starts what a first loader waits for."""
