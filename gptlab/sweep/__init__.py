"""gptlab-sweep's machinery: the plan (one generated config per pending run, one launch), the local queue that packs
a machine, and the status of a sweep in flight."""
