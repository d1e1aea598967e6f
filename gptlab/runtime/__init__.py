"""Where a process runs: hardware profiles, distributed setup, placement, CPU load, peak memory, machine peaks."""
