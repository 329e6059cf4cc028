"""What a GPU host runs, in words: which framework a process is and which workload it belongs
to, from its command line and environment. Pure: the agent reads the processes."""
