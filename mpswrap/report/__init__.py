"""What mpswrap tells people and machines: the summary line of a run, the farm's view,
the status of a node's jobs and its Prometheus metrics, all read from the same records."""
