"""The sections of a workload model (dataset, reader, train, checkpoint, ...) and the model itself."""

from __future__ import annotations

from dataclasses import dataclass, fields, is_dataclass
from typing import ClassVar

from dlreplay.errors import shown
from dlreplay.model.base import (
    ACCESS_FRACTION_TOLERANCE,
    AU_FIRST_STEPS,
    CONFIDENCES,
    DATA_LOADERS,
    FILE_BUFFERINGS,
    FORMATS,
    FRAMEWORKS,
    MP_CONTEXTS,
    SAMPLE_ORDERS,
    SHUFFLE_MODES,
    WORKER_KINDS,
    InvalidField,
    join_path,
    model_field,
    strip_optional,
    type_hints,
)
from dlreplay.model.distribution import Distribution
from dlreplay.model.layout import Layout

#: When a side file is read: once as the run starts, or at the start of every epoch.
SIDE_FILE_WHEN = ("start", "epoch")
#: Most side files a model lists (more are not side files but a dataset distill could not tell).
MAX_SIDE_FILES = 64


@dataclass(frozen=True, kw_only=True)
class SideFile:
    """A file in the data folder that the job reads outside its samples: a marker, a label
    list, a class index, a metadata JSON. ``generate`` writes it at its size and the replay
    reads it as the job did, in every rank's main process."""

    path: str = model_field(doc="path relative to the data folder")
    size: int = model_field(check="nonneg", doc="bytes")
    reads: list[list[int]] = model_field(
        factory=list,
        check="nonneg",
        doc="the read calls of one visit, in order: runs of [bytes per call, calls]",
    )
    visits: int = model_field(1, check="positive", doc="opens per rank at each reading")
    when: str = model_field("start", choices=SIDE_FILE_WHEN, doc="start: once; epoch: each epoch")

    _track_defaults: ClassVar[bool] = False

    def __post_init__(self) -> None:
        parts = self.path.replace("\\", "/").split("/")
        if (
            not self.path
            or "\x00" in self.path
            or self.path.startswith("/")
            or ".." in parts
            or parts[-1].startswith(".dlreplay-")
        ):
            raise InvalidField(
                "path",
                f"expected a path inside the data folder (relative, no '..', not dlreplay's own "
                f".dlreplay-* files), got {shown(self.path)}",
            )


@dataclass(frozen=True, kw_only=True)
class Dataset:
    """The training dataset's shape (DLIO ``dataset``)."""

    format: str = model_field(choices=FORMATS, doc="file format")
    num_files: int = model_field(check="positive", doc="training files (DLIO num_files_train)")
    num_samples_per_file: int = model_field(check="positive", doc="samples per file")
    record_length: Distribution = model_field(
        check="nonneg", doc="bytes per sample (per file where files_per_sample > 1)"
    )
    file_size: Distribution = model_field(
        factory=Distribution.unknown, check="nonneg", doc="bytes per file"
    )
    num_files_eval: int = model_field(0, check="nonneg", doc="evaluation files")
    num_subfolders: int = model_field(
        0, check="nonneg", doc="subfolders the training files are spread over"
    )
    data_folder: str | None = model_field(None, doc="where the dataset lives")
    record_length_resize: int | None = model_field(
        None, check="nonneg", doc="bytes per sample after the reader's resize (memory, not I/O)"
    )
    layout: Layout = model_field(factory=Layout, doc="format-specific layout")
    side_files: list[SideFile] | None = model_field(
        None,
        doc="files in the data folder read outside the samples (markers, labels, indexes); "
        "null: none",
    )
    files_per_sample: int = model_field(
        1,
        check="positive",
        doc="files each sample reads whole, one of each part in turn (an image and its mask: "
        "2); num_files counts every file, so num_files / files_per_sample samples (not DLIO)",
    )
    scan_read_size: int = model_field(
        0,
        check="nonneg",
        doc="bytes per read of a pass each rank makes over every dataset file, start to end, "
        "before its first epoch (a Dataset that indexes its records as it is made: a JSON-lines "
        "dataset finding its lines' offsets); 0: no such pass (not DLIO)",
    )

    def __post_init__(self) -> None:
        if self.files_per_sample > 1 and (
            self.num_samples_per_file != 1 or self.num_files % self.files_per_sample
        ):
            raise InvalidField(
                "files_per_sample",
                f"{self.files_per_sample} files a sample needs 1 sample a file and num_files a "
                f"multiple of it, got num_samples_per_file {self.num_samples_per_file} and "
                f"num_files {self.num_files}",
            )
        if self.side_files is not None and len(self.side_files) > MAX_SIDE_FILES:
            raise InvalidField(
                "side_files",
                f"expected at most {MAX_SIDE_FILES} side files, got {len(self.side_files)}",
            )


@dataclass(frozen=True, kw_only=True)
class AccessPattern:
    """Read access pattern on dataset files, as fractions (0..1) of read calls, as Darshan counts them.

    ``sequential``: offset after the previous read's; ``consecutive`` (a subset of
    sequential): offset exactly at the previous read's end; ``random``: neither.
    ``null`` = unknown.
    """

    sequential: float | None = model_field(None, check="fraction")
    consecutive: float | None = model_field(None, check="fraction")
    random: float | None = model_field(None, check="fraction")

    def __post_init__(self) -> None:
        tol = ACCESS_FRACTION_TOLERANCE
        if (
            self.sequential is not None
            and self.consecutive is not None
            and self.consecutive > self.sequential + tol
        ):
            raise InvalidField(
                "consecutive",
                f"expected at most sequential ({self.sequential!r}), "
                f"got {self.consecutive!r} (consecutive reads are sequential)",
            )
        if (
            self.sequential is not None
            and self.random is not None
            and self.sequential + self.random > 1 + tol
        ):
            raise InvalidField(
                "random",
                f"expected sequential + random <= 1, got {self.sequential!r} + {self.random!r}",
            )


@dataclass(frozen=True, kw_only=True)
class MetadataPerSample:
    """Metadata calls on dataset files per sample read (averages; ``null`` = unknown)."""

    opens: float | None = model_field(None, check="nonneg")
    closes: float | None = model_field(None, check="nonneg")
    stats: float | None = model_field(None, check="nonneg")
    lseeks: float | None = model_field(None, check="nonneg")


#: How reads of dataset files bypass the page cache (``reader.direct_io``).
DIRECT_IO_MODES = ("off", "on", "hybrid")
#: Default ``reader.direct_io_threshold`` (bytes): Lustre's default hybrid read threshold.
DIRECT_IO_THRESHOLD = 8 << 20


#: Libraries that stream shards (``reader.streaming.library``).
SHARD_LIBRARIES = ("tarfile", "webdataset", "pyarrow")
#: How an IterableDataset splits its shards over ranks, then over each rank's workers:
#: ``interleaved`` (rank r takes shards r::R, worker w of those w::W, as webdataset's
#: split_by_node/split_by_worker) or ``contiguous`` (blocks).
SHARD_SPLITS = ("interleaved", "contiguous")


@dataclass(frozen=True, kw_only=True)
class Streaming:
    """An IterableDataset that streams whole shards (tar, arrow): each loader worker opens its
    shards one after the other and reads each through once per epoch, yielding its samples."""

    library: str = model_field(
        "tarfile",
        choices=SHARD_LIBRARIES,
        doc="what reads the shards: tarfile (stream mode r|), webdataset, pyarrow (IPC stream)",
    )
    split: str = model_field("interleaved", choices=SHARD_SPLITS, doc="shards over ranks, workers")
    shuffle_buffer: int = model_field(
        0, check="nonneg", doc="samples in each worker's shuffle buffer (0 = in shard order)"
    )
    worker_start_time: Distribution = model_field(
        factory=lambda: Distribution.fixed(0.0),
        check="nonneg",
        doc="seconds a worker's first batch took beyond its later ones' (imports, the "
        "dataset's setup, the shuffle buffer's fill), once per worker process",
    )
    worker_start_cpu: Distribution = model_field(
        factory=lambda: Distribution.fixed(0.0),
        check="nonneg",
        doc="CPU seconds of worker_start_time (0 = slept)",
    )


#: How a mapped-access loop picks its windows' offsets (``reader.mapped_access.offsets``).
MAPPED_OFFSETS = ("uniform", "sequential")


@dataclass(frozen=True, kw_only=True)
class MappedAccess:
    """A loop without a DataLoader that takes windows of a memory-mapped file (nanoGPT's
    ``get_batch``): each step maps the file, takes ``windows_per_step`` windows of
    ``window_bytes`` and touches them (page faults, no read calls). Bytes, seconds."""

    file_bytes: int = model_field(0, check="nonneg", doc="bytes of the mapped training file")
    window_bytes: int = model_field(
        0, check="nonneg", doc="bytes of one window (overlapping slices of a step merged)"
    )
    windows_per_step: int = model_field(1, check="positive", doc="windows taken per step")
    slices_per_window: int = model_field(
        1, check="positive", doc="slices the job takes of each window (input, target: 2)"
    )
    slice_bytes: int = model_field(0, check="nonneg", doc="bytes of one slice")
    offsets: str = model_field(
        "uniform", choices=MAPPED_OFFSETS, doc="window offsets: uniform random, sequential"
    )
    map_per_step: bool = model_field(True, doc="a new mapping every step (else one per run)")
    data_time: Distribution = model_field(
        factory=lambda: Distribution.fixed(0.0),
        check="nonneg",
        doc="seconds per step from the previous step's end to the compute (taking the windows)",
    )
    eval_file_bytes: int = model_field(0, check="nonneg", doc="bytes of the validation file")
    eval_every_steps: int = model_field(0, check="nonneg", doc="steps between validations")
    eval_steps: int = model_field(0, check="nonneg", doc="batches per validation pass")
    eval_windows_per_step: int = model_field(0, check="nonneg", doc="windows per eval batch")
    eval_step_time: Distribution = model_field(
        factory=lambda: Distribution.fixed(0.0),
        check="nonneg",
        doc="seconds per validation batch (windows and forward)",
    )


@dataclass(frozen=True, kw_only=True)
class Reader:
    """How the data loader reads the dataset (DLIO ``reader``)."""

    data_loader: str = model_field("pytorch", choices=DATA_LOADERS)
    worker_kind: str = model_field("process", choices=WORKER_KINDS)
    batch_size: int = model_field(1, check="positive", doc="samples per training batch")
    batch_size_eval: int = model_field(1, check="positive", doc="samples per evaluation batch")
    read_threads: int = model_field(
        1, check="nonneg", doc="loader workers per rank (0 = the main process reads)"
    )
    computation_threads: int = model_field(
        1, check="positive", doc="preprocessing threads per rank"
    )
    prefetch_factor: int = model_field(
        2, check="nonneg", doc="batches prefetched per worker (PyTorch); tf.data buffer"
    )
    file_shuffle: str = model_field("off", choices=SHUFFLE_MODES)
    sample_shuffle: str = model_field("off", choices=SHUFFLE_MODES)
    shuffle_seed: int | None = model_field(None, doc="seed of seeded shuffling")
    shuffle_size: int | None = model_field(
        None, check="positive", doc="shuffle buffer in samples (tf.data)"
    )
    open_per_sample: bool = model_field(
        True, doc="open/close the file for every sample (else keep files open)"
    )
    multiprocessing_context: str = model_field(
        "fork",
        choices=MP_CONTEXTS,
        doc="how loader worker processes start (PyTorch multiprocessing_context, "
        "DLIO reader.multiprocessing_context): fork, spawn (a new interpreter "
        "per worker, importing the job's modules again at every start) or "
        "forkserver",
    )
    persistent_workers: bool = model_field(
        False,
        doc="keep loader workers across epochs (PyTorch persistent_workers); "
        "false: new workers every epoch, as PyTorch's default",
    )
    row_group_reads: bool = model_field(
        False,
        doc="parquet: an item reads the row group that holds its sample (pyarrow's "
        "ParquetFile.read_row_group: each file opened once a process, its footer read then, "
        "the last group read kept), not its whole file (DLIO's and pandas' readers)",
    )
    memory_map: bool = model_field(
        False,
        doc="indexed_binary: the job's reader maps each file (mmap) and takes its "
        "records from the mapping, without read calls (DLIO's "
        "mmap_indexed_binary reader, whose samples are views it never touches); npy: "
        "each process maps the file once (np.load(mmap_mode='r')) and copies a sample's "
        "row out of it, faulting its pages in",
    )
    file_buffering: str = model_field(
        "buffered",
        choices=FILE_BUFFERINGS,
        doc="how the job's Dataset handed files to the format's library (npz, npy, jpeg, "
        "png, hdf5): buffered = by path or a default Python file (a few large reads; hdf5: "
        "by path, HDF5's own driver), unbuffered = an unbuffered file object (every "
        "library read is one read call; hdf5: h5py's fileobj driver)",
    )
    direct_io: str = model_field(
        "off",
        choices=DIRECT_IO_MODES,
        doc="how the job's reads of dataset files bypass the page cache: off (buffered), on "
        "(every file opened with O_DIRECT, DLIO reader.odirect), hybrid (a read call of at "
        "least direct_io_threshold bytes goes direct, smaller ones buffered, as Lustre's "
        "hybrid_io_read_threshold_bytes in MLPerf Storage)",
    )
    direct_io_threshold: int = model_field(
        DIRECT_IO_THRESHOLD,
        check="positive",
        doc="hybrid: bytes from which a read call goes direct (ignored unless direct_io is hybrid)",
    )
    batch_tensors: int = model_field(
        1,
        check="positive",
        doc="tensors in each batch the loader hands over (image, label, mask, ...: PyTorch "
        "moves each one from a worker to the training process through shared memory, "
        "one file-descriptor handover per tensor); measured by dlreplay capture",
    )
    pin_memory: bool = model_field(
        False, doc="copy batches into page-locked memory (PyTorch pin_memory; only with a GPU)"
    )
    drop_last: bool = model_field(
        False, doc="drop each epoch's last batch when it is smaller than batch_size"
    )
    sample_order: str = model_field(
        "pytorch",
        choices=SAMPLE_ORDERS,
        doc="pytorch: rank r reads files r::N, shuffled anew every epoch as file_shuffle and "
        "sample_shuffle say (PyTorch's RandomSampler); dlio: DLIO 2.0's PyTorch sampler "
        "(rank r reads a contiguous block of samples, file_shuffle ignored, the seeded "
        "sample shuffle re-applied to the previous epoch's order, whole batches only)",
    )
    transfer_size: Distribution = model_field(
        factory=Distribution.unknown, check="nonneg", doc="bytes per read call on dataset files"
    )
    preprocess_time: Distribution = model_field(
        factory=lambda: Distribution.fixed(0.0),
        check="nonneg",
        doc="seconds of preprocessing per sample",
    )
    preprocess_host_cpu: Distribution = model_field(
        factory=lambda: Distribution.fixed(0.0),
        check="nonneg",
        doc="CPU seconds a loader worker spends per sample, the library's "
        "read and decode included (measured by dlreplay capture): the "
        "replay's worker spends what its own read and decode did not, "
        "inside preprocess_time, which is slept for the rest. 0 = the "
        "preprocessing is a sleep (DLIO)",
    )
    access_pattern: AccessPattern = model_field(factory=AccessPattern)
    metadata_per_sample: MetadataPerSample = model_field(factory=MetadataPerSample)
    streaming: Streaming | None = model_field(
        None, doc="shards streamed by an IterableDataset (tar, arrow); null = map-style reads"
    )
    mapped_access: MappedAccess | None = model_field(
        None, doc="windows of a memory-mapped file taken by a loop without a DataLoader"
    )


@dataclass(frozen=True, kw_only=True)
class Evaluation:
    """Periodic evaluation passes (DLIO ``evaluation``)."""

    every_n_epochs: int = model_field(1, check="positive", doc="DLIO epochs_between_evals")
    after_epoch: int = model_field(
        1, check="nonneg", doc="first epoch (1-based) after which to evaluate"
    )
    steps: int | None = model_field(
        None, check="positive", doc="steps per evaluation; null = the whole eval set"
    )
    computation_time: Distribution = model_field(
        factory=lambda: Distribution.fixed(0.0),
        check="nonneg",
        doc="seconds per evaluation step (DLIO eval_time)",
    )


@dataclass(frozen=True, kw_only=True)
class Train:
    """The training loop (DLIO ``train``)."""

    enabled: bool = model_field(
        True, doc="false = no training loop (e.g. a checkpoint-only workload)"
    )
    epochs: int = model_field(1, check="positive")
    steps_per_epoch: int | None = model_field(
        None, check="positive", doc="null = as many as the dataset gives"
    )
    total_training_steps: int | None = model_field(
        None, check="positive", doc="stop after this many steps in all"
    )
    computation_time: Distribution = model_field(
        factory=lambda: Distribution.fixed(0.0),
        check="nonneg",
        doc="seconds of compute per training step (steady state)",
    )
    computation_host_cpu: Distribution = model_field(
        factory=lambda: Distribution.fixed(0.0),
        check="nonneg",
        doc="CPU seconds the training process spends on the host per "
        "training step, all its threads (steady state; warm-up steps "
        "spend the same share of their compute time): spent inside the "
        "step's computation_time, which is slept for the rest. 0 = the "
        "compute runs on an accelerator and the step is a pure sleep "
        "(DLIO)",
    )
    computation_host_threads: int = model_field(
        1,
        check="positive",
        doc="threads that share computation_host_cpu (torch's intra-op "
        "threads of a CPU-trained model)",
    )
    timed_between_reads: bool = model_field(
        False,
        doc="computation_time (and reader.preprocess_time) are the training "
        "process's silences between its reads (a trace without loader events "
        "of a loop that reads its own samples): they hold the job's own loader "
        "work (collate, the loop), so the replay takes its own loader's work "
        "out of them instead of adding it",
    )
    warmup_computation_time: list[float] = model_field(
        factory=list,
        check="nonneg",
        doc="seconds of compute of the run's first steps, one per step "
        "(framework warm-up: kernel selection, allocator, CUDA "
        "context); they replace computation_time for those steps",
    )
    epoch_warmup_computation_time: list[float] = model_field(
        factory=list,
        check="nonneg",
        doc="seconds of compute of the first steps of every later "
        "epoch, one per step, where they differ from "
        "computation_time",
    )
    epoch_end_time: Distribution = model_field(
        factory=lambda: Distribution.fixed(0.0),
        check="nonneg",
        doc="seconds the training process spends after an epoch's last batch "
        "before the next epoch, beyond checkpoints and evaluation (logging, "
        "metrics, learning-rate schedules)",
    )
    au_first_steps: str = model_field(
        "run",
        choices=AU_FIRST_STEPS,
        doc="first steps AU leaves out: run = the run's first step (MLPerf Storage), "
        "epoch = every epoch's first step (DLIO)",
    )
    evaluation: Evaluation | None = model_field(None, doc="null = no evaluation")


#: Checkpoint file names (``Checkpoint.layout``).
CHECKPOINT_LAYOUTS = ("parts", "dcp")


@dataclass(frozen=True, kw_only=True)
class Checkpoint:
    """Checkpoint writes (DLIO ``checkpoint``). At most one ``*_between_checkpoints`` is set;
    none means once per epoch."""

    enabled: bool = model_field(False)
    checkpoint_folder: str | None = model_field(None)
    checkpoint_after_epoch: int = model_field(
        1, check="nonneg", doc="first epoch (1-based) of epoch-based checkpoints"
    )
    steps_between_checkpoints: int | None = model_field(None, check="positive")
    epochs_between_checkpoints: int | None = model_field(None, check="positive")
    time_between_checkpoints: float | None = model_field(None, check="positive", doc="seconds")
    files_per_checkpoint: int = model_field(1, check="positive")
    bytes_per_checkpoint: int = model_field(
        0, check="nonneg", doc="bytes written per checkpoint, all files"
    )
    write_transfer_size: Distribution = model_field(
        factory=Distribution.unknown, check="nonneg", doc="bytes per write call"
    )
    file_writes: list[list[list[int]]] | None = model_field(
        None,
        check="nonneg",
        doc="the write calls of each file of one checkpoint, in file order: runs of [bytes per call, calls] "
        "(torch.save: header, each tensor's storage, trailer); used when they add up to "
        "files_per_checkpoint and bytes_per_checkpoint, else write_transfer_size",
    )
    fsync: bool = model_field(False, doc="fsync each checkpoint file")
    serialization_time: Distribution = model_field(
        factory=lambda: Distribution.fixed(0.0),
        check="nonneg",
        doc="seconds per checkpoint outside write calls (serialisation, "
        "device-to-host copies), spent before the writes",
    )
    read_at_start: bool = model_field(False, doc="read the latest checkpoint before training")
    num_checkpoints_write: int | None = model_field(
        None, check="positive", doc="stop writing after this many"
    )
    num_checkpoints_read: int | None = model_field(
        None, check="nonneg", doc="checkpoints read back (DLIO)"
    )
    layout: str = model_field(
        "parts",
        choices=CHECKPOINT_LAYOUTS,
        doc="file names: parts (part-<j>-of-<n>.bin), dcp (torch.distributed.checkpoint: each "
        "rank's __<rank>_<n>.distcp, rank 0's .metadata last)",
    )
    file_ranks: list[int] | None = model_field(
        None,
        check="nonneg",
        doc="the rank that writes each file of one checkpoint (the order of file_writes); "
        "none: file j by rank j % ranks",
    )
    read_bytes_per_rank: int | None = model_field(
        None,
        check="nonneg",
        doc="bytes each rank reads from the latest checkpoint when it restores (read_at_start, "
        "num_checkpoints_read); none: its own files, whole",
    )
    read_transfer_size: Distribution = model_field(
        factory=Distribution.unknown, check="nonneg", doc="bytes per read call of a restore"
    )

    def __post_init__(self) -> None:
        given = [
            n
            for n in (
                "steps_between_checkpoints",
                "epochs_between_checkpoints",
                "time_between_checkpoints",
            )
            if getattr(self, n) is not None
        ]
        if len(given) > 1:
            raise InvalidField(
                given[1],
                f"expected at most one of steps/epochs/time_between_checkpoints, "
                f"but {given[0]} is also set",
            )
        if self.file_ranks is not None and len(self.file_ranks) != self.files_per_checkpoint:
            raise InvalidField(
                "file_ranks",
                f"expected one rank per file ({self.files_per_checkpoint}), "
                f"got {len(self.file_ranks)}",
            )
        for i, runs in enumerate(self.file_writes or []):
            for j, run in enumerate(runs):
                if len(run) != 2 or run[1] < 1:
                    raise InvalidField(
                        f"file_writes.{i}.{j}",
                        f"expected [bytes per call, calls >= 1], got {shown(run)}",
                    )

    @property
    def shard_ranks(self) -> int:
        """The ranks whose shards make one checkpoint (``file_ranks``), 0 when not given."""
        return max(self.file_ranks) + 1 if self.file_ranks else 0

    def file_write_plan(self) -> list[list[int]] | None:
        """Each checkpoint file's write calls (bytes), expanded from :attr:`file_writes`, when
        they agree with ``files_per_checkpoint`` and ``bytes_per_checkpoint``; else None."""
        fw = self.file_writes
        if not fw or len(fw) != self.files_per_checkpoint:
            return None
        if sum(size * calls for runs in fw for size, calls in runs) != self.bytes_per_checkpoint:
            return None
        return [[size for size, calls in runs for _ in range(calls)] for runs in fw]


@dataclass(frozen=True, kw_only=True)
class Processes:
    """How many processes read."""

    ranks: int = model_field(1, check="positive", doc="training processes (MPI/torchrun ranks)")
    workers_per_rank: int = model_field(
        1, check="nonneg", doc="data-loader workers observed per rank"
    )


@dataclass(frozen=True, kw_only=True)
class Parallelism:
    """Model parallelism (DLIO ``model.parallelism``); shapes checkpoint files."""

    tensor: int = model_field(1, check="positive")
    pipeline: int = model_field(1, check="positive")
    data: int | None = model_field(None, check="positive")
    zero_stage: int = model_field(0, doc="DeepSpeed ZeRO stage (-1..3)")

    def __post_init__(self) -> None:
        if not -1 <= self.zero_stage <= 3:
            raise InvalidField(
                "zero_stage", f"expected an integer from -1 to 3, got {shown(self.zero_stage)}"
            )


@dataclass(frozen=True, kw_only=True)
class Transformer:
    """Transformer dimensions (DLIO ``model.transformer``); DLIO sizes checkpoints from them."""

    vocab_size: int | None = model_field(None, check="positive")
    hidden_size: int | None = model_field(None, check="positive")
    ffn_hidden_size: int | None = model_field(None, check="positive")
    num_attention_heads: int | None = model_field(None, check="positive")
    num_kv_heads: int | None = model_field(None, check="positive")


@dataclass(frozen=True, kw_only=True)
class ModelInfo:
    """The trained model, as far as I/O cares (DLIO ``model``)."""

    name: str | None = model_field(None)
    type: str | None = model_field(None, doc="e.g. cnn, transformer")
    model_size: int | None = model_field(None, check="nonneg", doc="bytes of model state")
    num_layers: int | None = model_field(None, check="positive")
    model_datatype: str | None = model_field(None, doc="e.g. fp16")
    optimizer_datatype: str | None = model_field(None, doc="e.g. fp32")
    parallelism: Parallelism | None = model_field(None)
    transformer: Transformer | None = model_field(None)


@dataclass(frozen=True, kw_only=True)
class FieldProvenance:
    """How one field's value was obtained."""

    method: str = model_field(doc="how the value was obtained")
    confidence: str = model_field(choices=CONFIDENCES)

    _track_defaults: ClassVar[bool] = False


@dataclass(frozen=True, kw_only=True)
class Provenance:
    """Where the model came from. ``fields`` maps dotted field paths (``reader.batch_size``)
    to how each value was obtained."""

    source_trace: str | None = model_field(None, doc="trace directory the model was distilled from")
    source_config: str | None = model_field(None, doc="config file the model was imported from")
    capture_host: str | None = model_field(None)
    dlreplay_version: str | None = model_field(None)
    created: str | None = model_field(None, doc="ISO 8601 time")
    fields: dict[str, FieldProvenance] = model_field(factory=dict)
    notes: list[str] = model_field(factory=list, doc="lossy steps, ignored inputs")

    _track_defaults: ClassVar[bool] = False

    def __post_init__(self) -> None:
        valid = _valid_paths()
        for key in self.fields:
            if key not in valid:
                raise InvalidField(f"fields.{key}", "not a field of the workload model")
        object.__setattr__(self, "fields", dict(sorted(self.fields.items())))


#: Storage back ends of a model's ``storage`` section (DLIO's ``storage_type`` values).
STORAGE_TYPES = ("local_fs", "parallel_fs", "s3")
#: Client libraries a replay can read S3 objects with.
S3_CLIENTS = ("boto3", "s3torchconnector", "s3fs", "aiobotocore")


@dataclass(frozen=True, kw_only=True)
class Storage:
    """Where the dataset lives (DLIO ``storage``): a POSIX path, or objects in an S3 bucket.

    Never holds an endpoint or a credential: those come from the replaying host's usual
    environment (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``~/.aws``, ...)."""

    storage_type: str = model_field("local_fs", choices=STORAGE_TYPES)
    storage_root: str | None = model_field(None, doc="the bucket (s3) or a directory (local_fs)")
    prefix: str | None = model_field(None, doc="key prefix of the dataset's objects (s3)")
    client: str | None = model_field(None, choices=S3_CLIENTS, doc="the job's S3 client library")
    object_bytes: int | None = model_field(None, check="nonneg", doc="median object size, bytes")
    request_bytes: int | None = model_field(
        None, check="positive", doc="median bytes one GET asks for (the object's size: whole GETs)"
    )
    ranged: bool = model_field(False, doc="objects read in ranged GETs (Range: bytes=a-b)")


@dataclass(frozen=True, kw_only=True)
class WorkloadModel:
    """A workload: dataset, reader, training loop, checkpoints, processes, provenance."""

    model: ModelInfo = model_field(factory=ModelInfo)
    framework: str = model_field("pytorch", choices=FRAMEWORKS)
    dataset: Dataset = model_field()
    reader: Reader = model_field(factory=Reader)
    train: Train = model_field(factory=Train)
    checkpoint: Checkpoint = model_field(factory=Checkpoint)
    processes: Processes = model_field(factory=Processes)
    storage: Storage | None = model_field(None)
    provenance: Provenance = model_field(factory=Provenance)

    def __post_init__(self) -> None:
        if not self.dataset.record_length.is_known:
            raise InvalidField(
                "dataset.record_length", "expected a known distribution (bytes per sample)"
            )
        loader, fw = self.reader.data_loader, self.framework
        if (loader == "pytorch" and fw != "pytorch") or (
            loader == "tensorflow" and fw != "tensorflow"
        ):
            raise InvalidField(
                "reader.data_loader",
                f"data loader {loader} does not run under framework {fw}; "
                f"set framework={loader} or another data_loader",
            )


# --------------------------------------------------------------------------- field paths


def field_paths(include_distribution_parts: bool = False) -> list[str]:
    """Every dotted field path of a workload model (outside ``provenance``).

    Distributions count as one field (``train.computation_time``) unless
    *include_distribution_parts*.
    """
    out: list[str] = []

    def walk(cls: type, prefix: str) -> None:
        for f in fields(cls):
            path = join_path(prefix, f.name)
            inner, _ = strip_optional(type_hints(cls)[f.name])
            if inner is Provenance:
                continue
            out.append(path)
            if inner is Distribution:
                if include_distribution_parts:
                    out.extend(join_path(path, g.name) for g in fields(Distribution))
            elif isinstance(inner, type) and is_dataclass(inner):
                walk(inner, path)

    walk(WorkloadModel, "")
    return out


_VALID_PATHS: frozenset[str] | None = None


def _valid_paths() -> frozenset[str]:
    global _VALID_PATHS
    if _VALID_PATHS is None:
        _VALID_PATHS = frozenset(field_paths(include_distribution_parts=True))
    return _VALID_PATHS


def default_fields(model: WorkloadModel) -> list[str]:
    """Field paths whose provenance confidence is ``default`` (could not be inferred)."""
    return [k for k, v in model.provenance.fields.items() if v.confidence == "default"]
