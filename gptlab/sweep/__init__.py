"""gptlab-sweep's machinery: the sweep dir layout (layout.py, which compare/ reads), the definition (spec.py), the
designs beyond arm x seed (design.py, aa.py), arm identity (identity.py), the plan (plan.py: the pending runs, one
generated config each, one launch), launching (launch.py) and the local queue that packs a machine (queue.py), and
the status of a sweep in flight (status.py)."""
