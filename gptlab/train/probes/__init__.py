"""Capability probes: what a model can do beyond its val loss, measured at every eval step on FIXED sets.

`probes=[recall,induction,length]` picks them (conf/probes/<name>.yaml, one .py here each). The contract:

- built once per run by gptlab.config.build.build_probes as `cls(seed=data_seed, data=<the run's Data>,
  model=<the built GPT>, **keys)`; a key of its own is declared in the signature with its `rule` (the schema checks
  `probes.<name>.<key>` from it). An impossible probe for this run is a one-line ConfigError at build time;
- its set depends only on (data_seed, the run's vocabulary and training length, its own keys), never on the model
  choice or the seed: `fingerprint` names it (compare puts probe values of runs side by side only when equal);
- `measure(model, hardware, tokens_per_forward) -> {key: value}` runs no-grad in eval mode and draws nothing from
  the global RNG, so a run with probes trains exactly as one without; keys are `probe/<name>/...`.
"""
