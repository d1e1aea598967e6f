"""What the tests share and are not tests themselves: runners, fixtures, fake components, worker scripts.

tests/ is on sys.path (no tests/__init__.py; pytest's prepend import mode), so a test imports these as
`from helpers.train import FAST`. One module per concern:

- paths: REPO, CONF_DIR, TESTS (the repository, its conf/, this tests/ folder), pythonpath_with_tests for a child;
- cli: run_cli, the one way a test runs a CLI (`python -m MODULE`) as a subprocess; cli_env, its environment;
- train: FAST (a tiny fp32 config), run_inprocess (execute() one run in this process), train_env, rows, workers;
- model: TINY, VOCAB, tiny_model, tokens, choices (glob conf/<group>), least_disturbed_profile;
- fsdp: launch and compare real gloo ranks of gptlab-train (hardware=fsdp_cpu);
- slurm: the slurm_cluster fixture and sbatch/sacct helpers (scripts/slurm-cluster.sh);
- compare: synthetic run and sweep directories for gptlab-compare;
- wandb_read: read offline W&B runs back (`wandb leet inspect --json`);
- gpu_mocks: the fake_cuda fixture (torch.cuda mocked on a CPU machine);
- bad_input_rows: the rows of test_bad_input.py;
- contract: deliberately broken components (tests/contract_conf/*/leaky.yaml target them);
- readme_attention: an attention written only from the README (tests/contract_conf/attention/readme.yaml);
- ddp_worker, teardown_worker: ranks torchrun starts as `-m helpers.<name>` (tests/ on PYTHONPATH).
- twin_start: a gptlab-train that starts at a set moment (`-m helpers.twin_start`, tests/ on PYTHONPATH).
"""
