"""Above the algorithms: the run loop, the run directory (config, partition, metrics, ledger,
checkpoints, plots, summaries) and resume. It picks a transport; transports never import it."""
