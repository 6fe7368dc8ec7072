"""truba.daemon: the compute daemon, one per node, running jobs' tasks in slot subprocesses."""
