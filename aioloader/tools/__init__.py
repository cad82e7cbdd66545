"""The command line and the offline tools: `cli` (the `aioloader` command; `cli_cat`,
`cli_convert` its commands), `convert` (record files → sharded ArrayRecord) and `staged`
(output files that appear whole or not at all)."""
