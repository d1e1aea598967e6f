"""The rows of tests/test_bad_input.py: (overrides, environment, exit code, needle) for gptlab-train.

Kept in their own module so the test file stays short; each row is one test item there, named by its id
(`pytest tests/test_bad_input.py -k nodes-zero`). Placeholders: {d} inputs, {run} a finished 6-step run,
{s} special files, {corrupt}/{busy}/{grow} copies of runs, {cache_*} damaged token caches.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Row:
    id: str
    overrides: list[str]
    code: int
    needle: str
    env: dict = field(default_factory=dict)  # None = unset
    run_dir: str = "{run}"  # hydra.run.dir
    keep: str = "{run}"  # must be byte-identical afterwards
    process: bool = False  # also (or only, with fsize) as a real `python -m gptlab.cli.train`
    fsize: int | None = None  # RLIMIT_FSIZE in bytes: writes past it fail with EFBIG, like a full disk


NO_WANDB_KEY = {"WANDB_API_KEY": None, "NETRC": None, "HOME": "{d}"}
TABLE = [
    # Hydra: unknown choice, group or key; bad override syntax
    Row(
        "unknown-choice",
        ["attention=gqaa"],
        2,
        "attention=gqaa: no such option (did you mean attention=gqa?); available: gqa, hybrid, mha, mqa, sliding",
        process=True,
    ),
    Row(
        "unknown-model",
        ["model=gpt3"],
        2,
        "model=gpt3: no such option (did you mean model=gpt2?); available: gpt2, gpt2-large",
    ),
    Row(
        "unknown-group",
        ["attentio=gqa"],
        2,
        "attentio: no such key or group (did you mean attention?); allowed here: model, attention",
    ),
    Row(
        "unknown-train-key",
        ["train.max_step=5"],
        2,
        "train.max_step: no such key or group (did you mean train.max_steps?); allowed here: max_steps",
    ),
    Row("unknown-component-key", ["attention.widnow=4"], 2, "attention.widnow: no such key"),
    Row(
        "appended-train-key",
        ["+train.max_step=5"],
        2,
        "train.max_step: not a train key (did you mean train.max_steps?); allowed:",
    ),
    Row("appended-component-key", ["+attention.widnow=4"], 2, "attention.widnow"),
    Row(
        "appended-model-key",
        ["+model.n_layers=4"],
        2,
        "model.n_layers: not a model key (did you mean model.n_layer?); allowed: bias, block_size,",
    ),
    Row(
        "appended-hardware-key",
        ["+hardware.thread=4"],
        2,
        "hardware.thread: not a hardware key (did you mean hardware.threads?); allowed:",
    ),
    Row(
        "appended-sample-key",
        ["+sample.topk=5"],
        2,
        "sample.topk: not a sample key (did you mean sample.top_k?); allowed: temperature, tokens, top_k",
    ),
    Row(
        "renamed-train-key",
        ["+train.eval_batches=3"],
        2,
        "train.eval_batches: not a train key (renamed: use train.eval_sequences",
    ),
    Row("group-replaced-by-scalar", ["sample=5"], 2, "sample.tokens: missing from the config"),
    Row("removed-profile", ["~profile"], 2, "profile: missing from the config (removed with ~?); it is required"),
    Row("ambiguous-sweep-value", ["model=tiny,gpt2"], 2, "Ambiguous value for argument 'model=tiny,gpt2'"),
    Row("override-syntax", ["train.max_steps=["], 2, "cannot parse override 'train.max_steps=['"),
    Row(
        "override-non-ascii-unquoted",
        ["hydra.run.dir=/tmp/runé"],
        2,
        "a value with non-ASCII characters needs quotes: hydra.run.dir='/tmp/runé'",
    ),
    Row("removed-key", ["~seed"], 2, "seed: missing from the config"),
    Row("bad-interpolation", ["model.n_layer=${nope}"], 2, "Interpolation key 'nope' not found"),
    # wrong types and values
    Row("steps-not-int", ["train.max_steps=abc"], 2, "train.max_steps='abc': expected an integer"),
    Row("steps-float", ["train.max_steps=1.5"], 2, "train.max_steps=1.5: expected an integer"),
    Row("batch-not-int", ["train.batch_size=abc"], 2, "train.batch_size='abc': expected an integer", process=True),
    Row("steps-negative", ["train.max_steps=-5"], 2, "train.max_steps=-5: must be >= 1"),
    Row("eval-interval-zero", ["train.eval_interval=0"], 2, "train.eval_interval=0: must be >= 1"),
    Row("grad-clip-negative", ["train.grad_clip=-1"], 2, "train.grad_clip=-1: must be >= 0"),
    Row("nan-skip-negative", ["train.nan_skip=-1"], 2, "train.nan_skip=-1: must be >= 0"),
    Row(
        "prefetch-negative",
        ["train.prefetch=-1"],
        2,
        "train.prefetch=-1: must be >= 0 (0 = drawn in the training thread)",
    ),
    Row("prefetch-not-int", ["train.prefetch=1.5"], 2, "train.prefetch=1.5: expected an integer >= 0"),
    Row("prefetch-word", ["train.prefetch=abc"], 2, "train.prefetch='abc': expected an integer >= 0"),
    Row("seed-not-int", ["seed=abc"], 2, "seed='abc': expected an integer"),
    Row("grad-accum-divides", ["train.grad_accum=3"], 2, "train.grad_accum=3 must divide train.batch_size=8"),
    Row("dropout-range", ["model.dropout=1.5"], 2, "model.dropout=1.5: must be in [0, 1)"),
    Row("dropout-type", ["model.dropout=abc"], 2, "model.dropout='abc': expected a number"),
    Row("vocab-zero", ["model.vocab_size=0"], 2, "model.vocab_size=0: must be >= 1"),
    Row("heads-divide-width", ["model.d_model=130"], 2, "model.d_model=130"),
    Row("kv-heads-divide", ["attention=gqa", "attention.n_kv_head=3"], 2, "attention.n_kv_head=3"),
    Row("flash-with-window", ["attention=sliding", "attention.impl=flash"], 2, "attention.impl=flash"),
    Row("unknown-kernel", ["attention.impl=warp"], 2, "attention.impl"),
    Row("window-zero", ["attention=sliding", "attention.window=0"], 2, "attention.window"),
    Row("mlp-ratio-zero", ["mlp.ratio=0"], 2, "mlp.ratio=0"),
    Row("norm-placement", ["norm.placement=middle"], 2, "norm.placement: 'middle' is not allowed; allowed: pre, post"),
    Row(
        "unknown-dtype",
        ["hardware.dtype=fp8"],
        2,
        "hardware.dtype: unknown dtype 'fp8'; allowed: auto, fp32, bf16, fp16",
    ),
    Row("cuda-without-gpu", ["hardware=cuda"], 2, "hardware.device=cuda: no CUDA device is available here"),
    Row(
        "logger-mode",
        ["logger=wandb", "logger.wandb.mode=cloud"],
        2,
        "logger.wandb.mode='cloud' is not valid; allowed: auto, online",
    ),
    Row(
        "mha-with-kv-heads",
        ["attention=mha", "attention.n_kv_head=1"],
        2,
        "attention.n_kv_head=1 contradicts attention=mha (allowed: null or 4); for 1 KV heads use attention=gqa",
    ),
    Row(
        "window-on-full-attention",
        ["attention=gqa", "attention.n_kv_head=2", "attention.window=32"],
        2,
        "attention.window=32 makes attention=gqa a sliding window; allowed with gqa: null, or attention=sliding",
    ),
    Row(
        "csv-over-metrics",
        ["logger=csv", "logger.csv.filename=metrics.jsonl"],
        2,
        "logger.csv.filename='metrics.jsonl': must be a new name inside the run dir",
    ),
    Row(
        "tensorboard-outside",
        ["logger=tensorboard", "logger.tensorboard.log_dir=../tb"],
        2,
        "logger.tensorboard.log_dir='../tb': must be a new name inside the run dir",
    ),
    # data
    Row("missing-file", ["data=text", "data.paths=[{d}/missing.txt]"], 2, "data.paths: no file matches", process=True),
    Row("no-files", ["data=text", "data.paths=[]"], 2, "data.paths: no files given"),
    Row("empty-file", ["data=text", "data.paths=[{d}/empty.txt]"], 2, "empty.txt' is empty"),
    Row(
        "non-utf8",
        ["data=text", "data.paths=[{d}/latin1.txt]"],
        2,
        "latin1.txt' is not valid UTF-8 (bad byte near offset 3)",
    ),
    Row(
        "too-short-for-a-block",
        ["data=text", "data.paths=[{d}/short.txt]", "data.tokenizer=byte"],
        2,
        "model.block_size=64 needs at least 65",
    ),
    Row("directory-as-file", ["data=text", "data.paths=[{d}]"], 2, "is a directory"),
    Row("unsupported-type", ["data=text", "data.paths=[{d}/data.csv]"], 2, "unsupported file type '.csv'"),
    Row(
        "malformed-jsonl",
        ["data=text", "data.paths=[{d}/bad.jsonl]"],
        2,
        "data.paths: cannot read json file(s) bad.jsonl: line 2: Expecting value",
    ),
    Row(
        "missing-column",
        ["data=text", "data.paths=[{d}/docs.jsonl]"],
        2,
        "data.column: column 'text' not found in docs.jsonl; columns: body",
    ),
    Row("unknown-tokenizer", ["data.tokenizer=klingon"], 2, "data.tokenizer"),
    Row("val-fraction", ["data.val_fraction=1.5"], 2, "data.val_fraction=1.5: must be in (0, 1)"),
    Row(
        "vocab-smaller-than-tokenizer",
        ["model.vocab_size=10"],
        2,
        "model.vocab_size=10 is smaller than the shakespeare tokenizer's vocabulary",
    ),
    Row("recall-pairs", ["data=assoc_recall", "data.num_pairs=200"], 2, "data.num_pairs"),
    Row("recall-seq-len", ["data=assoc_recall", "data.seq_len=128"], 2, "data.seq_len"),
    Row("hub-without-name", ["data=hf"], 2, "data.name: got None"),
    Row(
        "hub-offline",
        ["data=hf", "data.name=some/dataset"],
        2,
        "hub dataset 'some/dataset' is not available offline (HF_HUB_OFFLINE=1)",
    ),
    # every knob typed and ranged before anything is built (gptlab/config/schema.py): booleans only booleans, enums only their values
    Row(
        "compile-quoted-false",
        ["hardware.compile='false'"],
        2,
        "hardware.compile: 'false' is not allowed; allowed: false, true, default, reduce-overhead, max-autotune",
    ),
    Row("compile-yes", ["hardware.compile=yes"], 2, "hardware.compile: 'yes' is not allowed; allowed: false, true,"),
    Row("compile-number", ["hardware.compile=2"], 2, "hardware.compile: 2 is not allowed; allowed: false, true,"),
    Row("compile-unknown-mode", ["hardware.compile=fastest"], 2, "hardware.compile: 'fastest' is not allowed"),
    Row(
        "tf32-quoted-false",
        ["hardware=auto", "hardware.tf32='false'"],
        2,
        "hardware.tf32='false': expected true or false (unquoted)",
    ),
    Row(
        "checkpointing-yes",
        ["hardware.activation_checkpointing=yes"],
        2,
        "hardware.activation_checkpointing='yes': expected true or false",
    ),
    Row("distributed-number", ["hardware.distributed=1"], 2, "hardware.distributed=1: expected true or false"),
    Row(
        "strategy-unknown",
        ["hardware=fsdp_cpu", "hardware.strategy=zero3"],
        2,
        "hardware.strategy: 'zero3' is not allowed; allowed: ddp, fsdp",
    ),
    Row(
        "fsdp-not-distributed",
        ["hardware=fsdp_cpu", "hardware.distributed=false"],
        2,
        "hardware.strategy=fsdp needs hardware.distributed=true; use hardware=fsdp (GPUs) or hardware=fsdp_cpu (gloo)",
    ),
    Row(
        "fsdp-fp16",
        ["hardware=fsdp_cpu", "hardware.dtype=fp16"],
        2,
        "hardware.dtype=fp16: not supported with hardware.strategy=fsdp",
    ),
    Row(
        "nodes-without-distributed",
        ["+hardware.nodes=2"],
        2,
        "hardware.nodes=2 needs a distributed profile (hardware.distributed=true); use hardware=ddp, ddp_cpu, fsdp or "
        "fsdp_cpu",
    ),
    Row("nodes-zero", ["hardware=ddp_cpu", "hardware.nodes=0"], 2, "hardware.nodes=0: must be >= 1"),
    Row(
        "cpu-offload-on-cpu",
        ["hardware=fsdp_cpu", "hardware.cpu_offload=true"],
        2,
        "hardware.cpu_offload=true: device=cpu already keeps everything in CPU memory; allowed: false, or true with a "
        "CUDA device (hardware=fsdp)",
    ),
    Row(
        "cpu-offload-under-ddp",
        ["hardware=fsdp_cpu", "hardware.strategy=ddp", "hardware.cpu_offload=true"],
        2,
        "hardware.cpu_offload=true needs hardware.strategy=fsdp (here ddp); use hardware=fsdp",
    ),
    Row(
        "cpu-offload-yes",
        ["hardware=fsdp_cpu", "hardware.cpu_offload=yes"],
        2,
        "hardware.cpu_offload='yes': expected true or false",
    ),
    Row(
        "reshard-number",
        ["hardware=fsdp_cpu", "hardware.reshard_after_forward=2"],
        2,
        "hardware.reshard_after_forward=2: expected true or false",
    ),
    Row("bias-quoted-false", ["model.bias='false'"], 2, "model.bias='false': expected true or false"),
    Row("tie-embeddings-no", ["model.tie_embeddings=no"], 2, "model.tie_embeddings='no': expected true or false"),
    Row("qk-norm-quoted-true", ["attention.qk_norm='true'"], 2, "attention.qk_norm='true': expected true or false"),
    Row("profile-yes", ["profile=yes"], 2, "profile='yes': expected true or false"),
    Row("fused-auto", ["optimizer.fused=auto"], 2, "optimizer.fused='auto': expected true or false or null"),
    Row(
        "match-params-maybe",
        ["mlp=swiglu", "mlp.match_params=maybe"],
        2,
        "mlp.match_params='maybe': expected true or false",
    ),
    Row(
        "match-knob-none",
        ["mlp=none", "model.match=params"],
        2,
        "model.match_knob=mlp: this mlp choice (NoMLP) has no hidden width to solve",
    ),
    Row("match-undoes-arm", ["mlp.ratio=2", "model.match=flops"], 2, "re-solves this arm into its baseline"),
    Row(
        "match-to-outside",
        ["model.match=params", 'model.match_to=["train.seed=1"]'],
        2,
        "model.match_to: 'train.seed=1'",
    ),
    Row("match-knob-typo", ["model.match=params", "model.match_knob=width"], 2, "model.match_knob: 'width' is not"),
    Row(
        "match-knob-without-match",
        ["model.match_knob=d_model"],
        2,
        "model.match_knob=d_model has no effect with model.match=null (nothing is matched); set model.match=params or "
        "flops; or drop model.match_knob",
    ),
    Row(
        "match-to-twice",
        ["model.match=params", 'model.match_to=["norm=layernorm","norm=rmsnorm"]'],
        2,
        "model.match_to: norm is given twice ('norm=layernorm', 'norm=rmsnorm'); give each key once",
    ),
    Row("min-lr-ratio-negative", ["schedule.min_lr_ratio=-3"], 2, "schedule.min_lr_ratio=-3: must be in [0, 1]"),
    Row("min-lr-ratio-above-one", ["schedule.min_lr_ratio=1.5"], 2, "schedule.min_lr_ratio=1.5: must be in [0, 1]"),
    Row("warmup-negative", ["schedule.warmup_steps=-10"], 2, "schedule.warmup_steps=-10: must be >= 0"),
    Row(
        "wsd-decay-fraction-zero",
        ["schedule=wsd", "schedule.decay_fraction=0"],
        2,
        "schedule.decay_fraction=0: must be in (0, 1]",
    ),
    Row("weight-decay-negative", ["optimizer.weight_decay=-5"], 2, "optimizer.weight_decay=-5: must be >= 0"),
    Row(
        "weight-decay-flips-weights",
        ["optimizer.weight_decay=1000"],
        2,
        "optimizer.weight_decay=1000: with optimizer.lr=0.003 each step scales the weights by 1 - lr*weight_decay = -2; "
        "allowed: < 333.3",
    ),
    Row(
        "global-layer-missing",
        ["attention=hybrid", "attention.global_layers=[99]"],
        2,
        "attention.global_layers[0]=99: no such layer; allowed: layer indices in [0, 2) (model.n_layer=2)",
    ),
    Row(
        "global-layer-negative",
        ["attention=hybrid", "attention.global_layers=[-1]"],
        2,
        "attention.global_layers[0]=-1: must be >= 0",
    ),
    Row(
        "global-every-zero",
        ["attention=hybrid", "attention.global_every=0"],
        2,
        "attention.global_every=0: must be >= 1 or null",
    ),
    Row(
        "window-not-int",
        ["attention=sliding", "attention.window=abc"],
        2,
        "attention.window='abc': expected an integer >= 1 or null",
    ),
    Row("kv-heads-zero", ["attention=gqa", "attention.n_kv_head=0"], 2, "attention.n_kv_head=0: must be >= 1 or null"),
    Row("attention-dropout-negative", ["attention.dropout=-0.1"], 2, "attention.dropout=-0.1: must be in [0, 1)"),
    Row("mlp-dropout-one", ["mlp.dropout=1"], 2, "mlp.dropout=1: must be in [0, 1)"),
    Row("mlp-ratio-nan", ["mlp.ratio=nan"], 2, "mlp.ratio=nan: must be a finite number > 0"),
    Row("norm-eps-negative", ["norm.eps=-1"], 2, "norm.eps=-1: must be > 0"),
    Row("norm-eps-inf", ["norm.eps=inf"], 2, "norm.eps=inf: must be a finite number > 0"),
    Row("rope-base-zero", ["position.base=0"], 2, "position.base=0: must be > 0"),
    Row("init-std-negative", ["model.init_std=-0.02"], 2, "model.init_std=-0.02: must be >= 0"),
    Row("mup-no-base-width", ["model.parametrization=mup"], 2, "model.mup_base_width=null: model.parametrization=mup"),
    Row(
        "mup-base-width-zero",
        ["model.parametrization=mup", "model.mup_base_width=0"],
        2,
        "model.mup_base_width=0: must be >= 1",
    ),
    Row(
        "mup-sgd",
        ["model.parametrization=mup", "model.mup_base_width=32", "optimizer=sgd"],
        2,
        "optimizer=sgd: model.parametrization=mup scales the lr of Adam-like updates only; allowed: optimizer=adamw or lion",
    ),
    Row(
        "grad-clip-nan",
        ["train.grad_clip=nan"],
        2,
        "train.grad_clip=nan: must be a finite number >= 0 (0 = no clipping)",
    ),
    Row(
        "sample-temperature-negative", ["sample.temperature=-1"], 2, "sample.temperature=-1: must be >= 0 (0 = greedy)"
    ),
    Row("sample-tokens-negative", ["sample.tokens=-5"], 2, "sample.tokens=-5: must be >= 0"),
    # values that used to pass validation, then crashed with a traceback after .hydra/ was overwritten
    Row("sample-top-k-negative", ["sample.top_k=-5"], 2, "sample.top_k=-5: must be >= 1 or null"),
    Row("sample-top-k-zero", ["sample.top_k=0"], 2, "sample.top_k=0: must be >= 1 or null"),
    Row("lr-negative", ["optimizer.lr=-1"], 2, "optimizer.lr=-1: must be > 0"),
    Row("lr-nan", ["optimizer.lr=nan"], 2, "optimizer.lr=nan: must be a finite number > 0"),
    Row("lr-inf", ["optimizer.lr=inf"], 2, "optimizer.lr=inf: must be a finite number > 0"),
    Row("lr-not-a-number", ["optimizer.lr=abc"], 2, "optimizer.lr='abc': expected a number > 0"),
    Row("betas-out-of-range", ["optimizer.betas=[2,3]"], 2, "optimizer.betas[0]=2: must be in [0, 1)"),
    Row(
        "betas-not-a-list",
        ["optimizer.betas=abc"],
        2,
        "optimizer.betas='abc': expected a list of 2 numbers, each in [0, 1)",
    ),
    Row("betas-one-value", ["optimizer.betas=[0.9]"], 2, "optimizer.betas=[0.9]: expected a list of 2 numbers"),
    Row(
        "lion-beta-negative",
        ["optimizer=lion", "optimizer.betas=[0.9,-0.1]"],
        2,
        "optimizer.betas[1]=-0.1: must be in [0, 1)",
    ),
    Row("adam-eps-zero", ["optimizer.eps=0"], 2, "optimizer.eps=0: must be > 0"),
    Row("sgd-momentum-one", ["optimizer=sgd", "optimizer.momentum=1"], 2, "optimizer.momentum=1: must be in [0, 1)"),
    Row(
        "sgd-nesterov-without-momentum",
        ["optimizer=sgd", "optimizer.momentum=0"],
        2,
        "optimizer.nesterov=true needs optimizer.momentum > 0",
    ),
    Row(
        "muon-adamw-beta-one",
        ["optimizer=muon", "optimizer.adamw_betas=[0.9,1.0]"],
        2,
        "optimizer.adamw_betas[1]=1.0: must be in [0, 1)",
    ),
    Row("muon-adamw-lr-zero", ["optimizer=muon", "optimizer.adamw_lr=0"], 2, "optimizer.adamw_lr=0: must be > 0"),
    Row("threads-negative", ["hardware.threads=-1"], 2, "hardware.threads=-1: must be >= 1 or null"),
    Row("threads-not-int", ["hardware.threads=abc"], 2, "hardware.threads='abc': expected an integer >= 1 or null"),
    Row(
        "peak-flops-not-a-number",
        ["hardware.peak_flops=abc"],
        2,
        "hardware.peak_flops='abc': expected 'auto' or a number > 0",
    ),
    Row("peak-flops-negative", ["hardware.peak_flops=-1"], 2, "hardware.peak_flops=-1: must be > 0"),
    Row("mem-bandwidth-zero", ["hardware.mem_bandwidth=0"], 2, "hardware.mem_bandwidth=0: must be > 0"),
    Row("cpus-per-task-zero", ["hardware.cpus_per_task=0"], 2, "hardware.cpus_per_task=0: must be >= 1 or null"),
    Row("seed-2-to-the-70", [f"seed={2**70}"], 2, f"seed={2**70}: must be in [0, 2**63)"),
    Row("seed-negative", ["seed=-1"], 2, "seed=-1: must be in [0, 2**63)"),
    Row("data-seed-2-to-the-64", [f"data_seed={2**64}"], 2, f"data_seed={2**64}: must be in [0, 2**63)"),
    Row("multiple-of-zero", ["mlp=swiglu", "mlp.multiple_of=0"], 2, "mlp.multiple_of=0: must be >= 1"),
    Row("num-proc-zero", ["data.num_proc=0"], 2, "data.num_proc=0: must be >= 1 or null"),
    Row("bpe-vocab-too-small", ["data.bpe_vocab_size=100"], 2, "data.bpe_vocab_size=100: must be >= 257"),
    # a damaged token cache (copies of {run}'s entry under their own GPTLAB_CACHE) is refused, naming the folder to delete
    Row(
        "cache-truncated",
        [],
        2,
        "is corrupt (shard_00000.bin has 1151360 bytes, index.json says 1151360 uint16 ids = 2302720 bytes); "
        "delete that folder and run again to rebuild it",
        env={"GPTLAB_CACHE": "{cache_truncated}"},
    ),
    # ids are range-checked when written and by data.verify=true (a full scan of a 10 GB cache on every start would not
    # be cheap; an out-of-range id fails the embedding lookup loudly anyway)
    Row(
        "cache-ids-out-of-range",
        ["data.verify=true"],
        2,
        "is corrupt (shard_00000.bin holds token id 60000, the tokenizer has",
        env={"GPTLAB_CACHE": "{cache_ids}"},
    ),
    Row(
        "bpe-sample-too-small",
        ["data=text", "data.paths=[{d}/docs.jsonl]", "data.bpe_sample_bytes=1000"],
        2,
        "data.bpe_sample_bytes=1000: must be >= 1000000",
    ),
    Row(
        "max-tokens-zero", ["data=hf", "data.name=x", "data.max_tokens=0"], 2, "data.max_tokens=0: must be >= 1 or null"
    ),
    Row("verify-not-bool", ["data.verify=maybe"], 2, "data.verify='maybe'"),
    # data files that are not regular text, refused at once ({s}: outside {d}, whose digest must never read them)
    Row(
        "fifo",
        ["data=text", "data.paths=[{s}/fifo.txt]"],
        2,
        "fifo.txt' is not a regular file (a FIFO, i.e. a named pipe)",
        process=True,
    ),
    Row("fifo-by-glob", ["data=text", "data.paths=[{s}/fifo*]"], 2, "fifo.txt' is not a regular file (a FIFO"),
    Row(
        "device-behind-symlink",
        ["data=text", "data.paths=[{s}/zero.txt]"],
        2,
        "zero.txt' is not a regular file (a character device)",
    ),
    Row(
        "dev-null", ["data=text", "data.paths=[/dev/null]"], 2, "'/dev/null' is not a regular file (a character device)"
    ),
    Row("nul-only-file", ["data=text", "data.paths=[{s}/nul.txt]"], 2, "nul.txt' contains no text (only NUL bytes)"),
    Row("sparse-1gb-file", ["data=text", "data.paths=[{s}/sparse.txt]"], 2, "sparse.txt' contains no text"),
    Row("symlink-loop", ["data=text", "data.paths=[{s}/loop_a.txt]"], 2, "loop_a.txt' is a symlink loop"),
    Row(
        "broken-symlink",
        ["data=text", "data.paths=[{s}/dangling.txt]"],
        2,
        "dangling.txt' is a broken symlink (its target '{s}/missing.txt' does not exist)",
    ),
    # accepted but inert: a key given on the command line that cannot act under the chosen options is refused, naming
    # the key, what makes it inert and what to do (gptlab/config/noop.py); a key a choice's constructor does not take
    # (another schedule's knob) is refused by its signature
    Row(
        "constant-min-lr-ratio",
        ["schedule=constant", "schedule.min_lr_ratio=0.5"],
        2,
        "schedule.min_lr_ratio: not a key of schedule=constant; allowed here: warmup_steps",
    ),
    Row(
        "constant-min-lr-ratio-appended",
        ["schedule=constant", "+schedule.min_lr_ratio=0.5"],
        2,
        "schedule.min_lr_ratio: not a key of this schedule choice (Constant); allowed: warmup_steps",
    ),
    Row(
        "cosine-decay-fraction",
        ["schedule=cosine", "schedule.decay_fraction=0.5"],
        2,
        "schedule.decay_fraction: not a key of schedule=cosine; allowed here: warmup_steps, min_lr_ratio",
    ),
    Row(
        "cosine-decay-fraction-appended",
        ["+schedule.decay_fraction=0.5"],
        2,
        "schedule.decay_fraction: not a key of this schedule choice (Cosine); allowed: warmup_steps, min_lr_ratio",
    ),
    Row(
        "global-every-without-window",
        ["attention.global_every=2"],
        2,
        "attention.global_every=2 has no effect without attention.window (attention=mha): every layer is full "
        "attention; for global layers between windowed ones use attention=hybrid; or drop attention.global_every",
    ),
    Row(
        "global-layers-with-gqa",
        ["attention=gqa", "attention.n_kv_head=2", "attention.global_layers=[0]"],
        2,
        "attention.global_layers=[0] has no effect without attention.window (attention=gqa)",
    ),
    Row(
        "spike-dump-without-factor",
        ["train.spike_dump=true"],
        2,
        "train.spike_dump=true has no effect with train.spike_factor=null (spike detection off); set "
        "train.spike_factor (> 1, e.g. 3); or drop train.spike_dump",
    ),
    Row(
        "spike-window-without-factor",
        ["train.spike_window=9"],
        2,
        "train.spike_window=9 has no effect with train.spike_factor=null",
    ),
    Row(
        "temperature-without-sample",
        ["sample.temperature=0.5"],
        2,
        "sample.temperature=0.5 has no effect with sample.tokens=0 (no sample is drawn); set sample.tokens > 0",
    ),
    Row(
        "top-k-when-greedy",
        ["sample.tokens=5", "sample.temperature=0", "sample.top_k=3"],
        2,
        "sample.top_k=3 has no effect with sample.temperature=0 (greedy: always the most likely token)",
    ),
    Row(
        "bpe-vocab-under-char",
        ["data.bpe_vocab_size=500"],
        2,
        "data.bpe_vocab_size=500 has no effect with data.tokenizer=char (settings of the BPE fit); use data.tokenizer=bpe",
    ),
    Row(
        "reshard-without-fsdp",
        ["hardware=fsdp_cpu", "hardware.strategy=ddp", "hardware.reshard_after_forward=false"],
        2,
        "hardware.reshard_after_forward=false has no effect without FSDP (hardware.strategy=ddp, distributed=true)",
    ),
    Row("tf32-on-cpu", ["+hardware.tf32=false"], 2, "hardware.tf32=false has no effect on hardware.device=cpu"),
    Row(
        "logger-key-not-selected",
        ["+logger.csv.filename=a.csv"],
        2,
        "logger.csv.filename: logger csv is not selected (logger=none), so nothing reads it; select it",
    ),
    Row(
        "probe-key-not-selected",
        ["+probes.recall.queries=3"],
        2,
        "probes.recall.queries: probes recall is not selected (probes=none), so nothing reads it",
    ),
    # `+` keys nothing reads, in every group: refused like unknown keys
    Row("appended-root-mapping", ["+foo.bar=1"], 2, "foo: not a config key; allowed: arm, attention,"),
    Row("appended-data-key", ["+data.foo=1"], 2, "data.foo: not a key of this data choice (ShakespeareData)"),
    Row(
        "appended-key-of-another-optimizer",
        ["+optimizer.momentum=0.9"],
        2,
        "optimizer.momentum: not a key of this optimizer choice (adamw)",
    ),
    Row(
        "appended-schedule-typo",
        ["+schedule.warmup=5"],
        2,
        "schedule.warmup: not a key of this schedule choice (Cosine) (did you mean schedule.warmup_steps?)",
    ),
    Row(
        "appended-logger-key",
        ["logger=csv", "+logger.csv.flush=1"],
        2,
        "logger.csv.flush: not a key of this logger.csv choice",
    ),
    Row(
        "appended-key-of-another-position",
        ["position=learned", "+position.base=500"],
        2,
        "position.base: not a key of this position choice (LearnedPosition)",
    ),
    Row(
        "appended-key-of-another-mlp",
        ["+mlp.match_params=true"],
        2,
        "mlp.match_params: not a key of this mlp choice (GeluMLP)",
    ),
    Row("appended-norm-key", ["+norm.bias=true"], 2, "norm.bias: not a key of this norm choice (rmsnorm)"),
    # resume
    Row(
        "resume-missing-file",
        ["train.resume={d}/missing.pt"],
        2,
        "train.resume='{d}/missing.pt': not auto, never, or an existing checkpoint file",
    ),
    Row("resume-directory", ["train.resume={d}"], 2, "not auto, never, or an existing checkpoint file"),
    Row("resume-truncated", ["train.resume={d}/truncated.pt"], 2, "truncated.pt' is unreadable"),
    Row(
        "resume-code-in-pickle",
        ["train.resume={d}/evil.pt"],
        2,
        "evil.pt' is unreadable (UnpicklingError: weights_only=True refused it: Unsupported global: GLOBAL print",
    ),
    Row("resume-not-a-checkpoint", ["train.resume={d}/plain.pt"], 2, "plain.pt' is not a gptlab checkpoint"),
    # strict resume: {run} is a finished 6-step run of BASE; any curve-changing difference is refused, naming each
    Row(
        "resume-other-width",
        ["model.d_model=128"],
        2,
        "belongs to a run with another config: model.d_model=64 there, 128 here; use",
    ),
    Row(
        "resume-other-tokenizer",
        ["data.tokenizer=byte"],
        2,
        "another config: data.tokenizer=char there, byte here; use",
    ),
    Row(
        "resume-other-vocab", ["model.vocab_size=128"], 2, "another config: model.vocab_size=None there, 128 here; use"
    ),
    Row(
        "resume-other-components",
        ["mlp=relu2", "position=none", "optimizer=lion"],
        2,
        "another config: mlp=gelu there, relu2 here; optimizer=adamw there, lion here; position=rope there, none here; use",
    ),
    Row("resume-sliding", ["attention=sliding"], 2, "attention=mha there, sliding here"),
    Row("resume-gqa", ["attention=gqa", "attention.n_kv_head=2"], 2, "attention=mha there, gqa here"),
    Row("resume-layernorm", ["norm=layernorm"], 2, "norm=rmsnorm there, layernorm here"),
    Row("resume-post-norm", ["norm.placement=post"], 2, "norm.placement=pre there, post here"),
    Row("resume-alibi", ["position=alibi"], 2, "position=rope there, alibi here"),
    Row("resume-constant-schedule", ["schedule=constant"], 2, "schedule=cosine there, constant here"),
    Row("resume-other-lr", ["optimizer.lr=0.03"], 2, "another config: optimizer.lr=0.003 there, 0.03 here; use"),
    Row("resume-sgd", ["optimizer=sgd"], 2, "optimizer=adamw there, sgd here"),
    Row("resume-muon", ["optimizer=muon"], 2, "optimizer=adamw there, muon here"),
    Row("resume-data-seed", ["data_seed=7"], 2, "data_seed=1337 there, 7 here"),
    Row("resume-batch-size", ["train.batch_size=16"], 2, "train.batch_size=8 there, 16 here"),
    Row("resume-grad-accum", ["train.grad_accum=2"], 2, "train.grad_accum=1 there, 2 here"),
    Row("resume-eval-set", ["train.eval_sequences=32"], 2, "train.eval_sequences=16 there, 32 here"),
    Row("resume-dropout", ["model.dropout=0.1"], 2, "model.dropout=0.0 there, 0.1 here"),
    Row(
        "resume-mup",
        ["model.parametrization=mup", "model.mup_base_width=32"],
        2,
        "model.mup_base_width=None there, 32 here; model.parametrization=sp there, mup here; use",
    ),
    Row("resume-dtype", ["hardware.dtype=bf16"], 2, "hardware.dtype=fp32 there, bf16 here"),
    Row(
        "resume-shrink-steps",
        ["train.max_steps=3"],
        2,
        "train.max_steps=3: checkpoint in the run dir is already at step 6; allowed: >= 6",
    ),
    Row(
        "resume-extend-cosine",
        ["train.max_steps=12"],
        2,
        "train.max_steps=6 there, 12 here: the schedule gives step 3 another LR (0.868198 vs 0.977975 x lr); only schedule=constant",
    ),
    Row(
        "resume-never-into-used-dir",
        ["train.resume=never"],
        2,
        "train.resume=never: {run}/checkpoints holds checkpoints of an earlier run (newest step_0000006.pt)",
    ),
    Row("resume-all-corrupt", [], 2, "none of the 1 checkpoints", run_dir="{corrupt}", keep="{corrupt}"),
    # environment (tests run as root, which ignores chmod: a file where the run dir should be stands in for an unwritable dir)
    Row(
        "run-dir-is-a-file",
        [],
        1,
        "I/O error '{d}/plain.pt': File exists; hydra.run.dir must name a directory",
        run_dir="{d}/plain.pt",
        keep="{d}",
    ),
    Row(
        "run-dir-under-a-file",
        [],
        1,
        "Not a directory; hydra.run.dir must not be under a file",
        run_dir="{d}/plain.pt/run",
        keep="{d}",
    ),
    Row(
        "run-dir-in-use",
        [],
        2,
        "busy' is in use by another running gptlab-train; give this run its own dir",
        run_dir="{busy}",
        keep="{busy}",
    ),
    Row(
        "wandb-online-without-key",
        ["logger=wandb", "logger.wandb.mode=online"],
        2,
        "logger.wandb.mode=online but no W&B API key is configured",
        env=NO_WANDB_KEY,
    ),
    # resumes {grow} (schedule=constant, so 6 -> 10 steps is allowed) at step 6, then the step-8 checkpoint outgrows a 256 KiB file size limit (EFBIG, like ENOSPC;
    # tests run as root, which ignores read-only permissions): step 6 must stay intact, no temp file left
    Row(
        "disk-full-while-checkpointing",
        ["schedule=constant", "train.max_steps=10", "train.ckpt_interval=2"],
        1,
        "I/O error '{grow}/checkpoints/step_0000008.pt': cannot write checkpoint (File too large); the file size limit",
        run_dir="{grow}",
        keep="{grow}/checkpoints",
        process=True,
        fsize=256 * 1024,
    ),
]
