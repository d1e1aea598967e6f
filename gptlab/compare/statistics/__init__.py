"""Statistics of seeds: Welch tests and intervals, the one Verdict type, power, speed figures and the machine's noise floor."""
