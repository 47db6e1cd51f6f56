"""DLIO interoperability: import DLIO workload YAML, export it back, round trips."""

from __future__ import annotations

import dataclasses
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from dlreplay.dlio import (
    DLIO_ALLOWED_KEYS,
    DLIO_DISTRIBUTION_FIELDS,
    DLIO_DISTRIBUTION_KEYS,
    DLIO_ENUM_VALUES,
    DLIO_NESTED_KEYS,
    dlio_checkpoint_estimate,
    dlio_key_problems,
    dlio_to_model,
    export_dlio,
    import_dlio,
    model_to_dlio,
)
from dlreplay.errors import ModelError
from dlreplay.model import (
    AccessPattern,
    Distribution,
    Evaluation,
    ModelInfo,
    Parallelism,
    Provenance,
    Transformer,
    WorkloadModel,
    apply_overrides,
    load_model,
    model_from_dict,
    save_model,
)

# The two DLIO configurations shown in the seed talk (000_19bdc7accc3d26a2.txt), verbatim.
UNET3D = """\
model:
  name: unet3d
  type: cnn
  model_size: 499153191

framework: pytorch

workflow:
  generate_data: False
  train: True
  checkpoint: True

dataset:
  data_folder: data/unet3d/
  format: npz
  num_files_train: 168
  num_samples_per_file: 1
  record_length_bytes: 146600628
  record_length_bytes_stdev: 683418
  record_length_bytes_resize: 20971

reader: |
  data_loader: pytorch
  batch_size: 7
  read_threads: 4
  file_shuffle: seed
  sample_shuffle: seed

train:
  epochs: 5
  computation_time: 0.636
"""

LLAMA_405B = """\
model:
  name: llama_405b
  type: transformer
  num_layers: 126
  model_datatype: fp16
  optimizer_datatype: fp32
  parallelism:
    tensor: 8
    pipeline: 32
    zero_stage: 1
  transformer:
    vocab_size: 128256
    hidden_size: 16384
    ffn_hidden_size: 53248
    num_attention_heads: 128
    num_kv_heads: 8

framework: pytorch

workflow:
  generate_data: False
  train: False
  checkpoint: True

checkpoint:
  checkpoint_folder: checkpoints/llama_405b
  time_between_checkpoints: 5
  num_checkpoints_write: 10
  num_checkpoints_read: 10
  fsync: True
"""

# Written for these tests: CosmoFlow-like (HDF5, several samples per file, chunked and
# compressed, evaluation) and ResNet-50-like (many small JPEG files in subfolders).
COSMOFLOW = """\
model: cosmoflow
framework: pytorch
workflow:
  generate_data: False
  train: True
  evaluation: True
dataset:
  data_folder: data/cosmoflow_h5
  format: hdf5
  num_files_train: 1024
  num_files_eval: 64
  num_samples_per_file: 4
  record_length_bytes: 2828486
  record_length_bytes_stdev: 71311
  enable_chunking: True
  chunk_size: 1048576
  compression: gzip
  compression_level: 4
  hdf5:
    chunk_dims: [1, 128, 128, 4]
reader:
  data_loader: pytorch
  batch_size: 4
  batch_size_eval: 8
  read_threads: 4
  computation_threads: 2
  prefetch_size: 8
  file_shuffle: seed
  sample_shuffle: seed
  transfer_size: 1048576
train:
  epochs: 4
  computation_time:
    type: gamma
    shape: 2.0
    scale: 0.0175
  seed: 7
evaluation:
  eval_time: 0.011
  epochs_between_evals: 2
"""

RESNET = """\
model:
  name: resnet50
framework: tensorflow
workflow:
  generate_data: False
  train: True
dataset:
  data_folder: data/resnet50
  format: jpeg
  num_files_train: 100000
  num_samples_per_file: 1
  record_length_bytes: 114660
  record_length_bytes_stdev: 136075
  record_length_bytes_resize: 150528
  num_subfolders_train: 1000
reader:
  data_loader: tensorflow
  batch_size: 64
  read_threads: 8
  computation_threads: 8
  prefetch_size: 4
  file_shuffle: random
  sample_shuffle: random
  shuffle_size: 1024
  preprocess_time: {type: normal, mean: 0.0003, stdev: 0.0001}
train:
  epochs: 3
  computation_time:
    type: normal
    mean: 0.103
    stdev: 0.012
  total_training_steps: 5000
"""

CONFIGS = {"unet3d": UNET3D, "llama_405b": LLAMA_405B, "cosmoflow": COSMOFLOW, "resnet50": RESNET}


def write(tmp_path: Path, text: str, name: str = "workload.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def comparable(model: WorkloadModel) -> WorkloadModel:
    """The model without provenance (which records where values came from, not what they are)."""
    return dataclasses.replace(model, provenance=Provenance())


def round_trip(
    tmp_path: Path, model: WorkloadModel
) -> tuple[WorkloadModel, list[str], dict[str, Any]]:
    out = tmp_path / "exported.yaml"
    warnings = export_dlio(model, out)
    return import_dlio(out), warnings, yaml.safe_load(out.read_text())


def allowed_only(config: dict[str, Any]) -> None:
    """Every key of an exported config is in the module's DLIO allow-list (checked independently)."""
    for section, body in config.items():
        assert section in DLIO_ALLOWED_KEYS, section
        if section == "framework":
            assert body in DLIO_ENUM_VALUES["framework"]
            continue
        for key, value in body.items():
            dotted = f"{section}.{key}"
            assert key in DLIO_ALLOWED_KEYS[section], dotted
            if dotted in DLIO_NESTED_KEYS:
                assert set(value) <= DLIO_NESTED_KEYS[dotted], dotted
            if dotted in DLIO_DISTRIBUTION_FIELDS and isinstance(value, dict):
                assert set(value) == DLIO_DISTRIBUTION_KEYS[value["type"]], dotted
            if dotted in DLIO_ENUM_VALUES:
                assert value in DLIO_ENUM_VALUES[dotted], dotted
    assert dlio_key_problems(config) == []


# --------------------------------------------------------------------------- import


def test_import_unet3d(tmp_path: Path) -> None:
    model = import_dlio(write(tmp_path, UNET3D))
    assert model.model == ModelInfo(name="unet3d", type="cnn", model_size=499153191)
    ds = model.dataset
    assert (ds.format, ds.num_files, ds.num_samples_per_file, ds.data_folder) == (
        "npz",
        168,
        1,
        "data/unet3d/",
    )
    assert ds.record_length == Distribution(type="normal", mean=146600628, stdev=683418)
    assert ds.record_length_resize == 20971
    rd = model.reader  # from the `reader: |` block string
    assert (rd.data_loader, rd.batch_size, rd.read_threads, rd.file_shuffle, rd.sample_shuffle) == (
        "pytorch",
        7,
        4,
        "seed",
        "seed",
    )
    assert rd.prefetch_factor == 1  # DLIO: ceil(prefetch_size 2 / read_threads 4)
    assert rd.worker_kind == "process"
    assert model.train.epochs == 5 and model.train.computation_time == Distribution.fixed(0.636)
    ck = model.checkpoint
    assert ck.enabled and ck.epochs_between_checkpoints == 1 and ck.checkpoint_after_epoch == 1
    assert (ck.bytes_per_checkpoint, ck.files_per_checkpoint) == (499153191, 1)
    assert model.processes.workers_per_rank == 4
    fields = model.provenance.fields
    assert fields["reader.batch_size"].confidence == "measured"
    assert fields["reader.batch_size"].method == "DLIO reader.batch_size"
    assert fields["dataset.record_length"].confidence == "measured"
    assert fields["model.model_size"].method == "DLIO model.model_size"
    assert fields["reader.batch_size_eval"].confidence == "default"
    assert fields["reader.prefetch_factor"].confidence == "inferred"
    assert fields["checkpoint.bytes_per_checkpoint"].confidence == "inferred"
    assert fields["reader.access_pattern"].confidence == "default"
    assert model.provenance.source_config == str(tmp_path / "workload.yaml")


def test_import_llama_checkpoint_workload(tmp_path: Path) -> None:
    model = import_dlio(write(tmp_path, LLAMA_405B))
    assert not model.train.enabled
    info = model.model
    assert info.parallelism == Parallelism(tensor=8, pipeline=32, zero_stage=1)
    assert info.transformer == Transformer(
        vocab_size=128256,
        hidden_size=16384,
        ffn_hidden_size=53248,
        num_attention_heads=128,
        num_kv_heads=8,
    )
    assert (info.num_layers, info.model_datatype, info.optimizer_datatype) == (126, "fp16", "fp32")
    ck = model.checkpoint
    assert ck.enabled and ck.fsync and ck.checkpoint_folder == "checkpoints/llama_405b"
    assert ck.time_between_checkpoints == 5.0 and ck.epochs_between_checkpoints is None
    assert (ck.num_checkpoints_write, ck.num_checkpoints_read) == (10, 10)
    assert model.processes.ranks == 8 * 32
    params = 2 * 128256 * 16384 + 16384 + 126 * (2 * 16384 + 4 * 16384**2 + 3 * 16384 * 53248)
    assert ck.bytes_per_checkpoint == 14 * params  # fp16 layers + three fp32 optimizer tensors
    assert ck.files_per_checkpoint == (126 + 3) * 8 + 256
    assert model.provenance.fields["checkpoint.bytes_per_checkpoint"].confidence == "inferred"
    assert model.provenance.fields["dataset.format"].confidence == "default"  # no dataset section


def test_checkpoint_estimate_variants() -> None:
    assert dlio_checkpoint_estimate(ModelInfo(model_size=100)) is None
    small = ModelInfo(
        num_layers=2, transformer=Transformer(hidden_size=4, ffn_hidden_size=8, vocab_size=10)
    )
    params = 2 * 10 * 4 + 4 + 2 * (2 * 4 + 4 * 16 + 3 * 4 * 8)
    assert dlio_checkpoint_estimate(small) == (14 * params, 5 + 1)
    zero0 = dataclasses.replace(small, parallelism=Parallelism(data=2, zero_stage=0), model_size=7)
    assert dlio_checkpoint_estimate(zero0) == (2 * params + 24 * params + 2 * 7, 5 + 2 + 2)


def test_import_legacy_spellings_and_forms(tmp_path: Path) -> None:
    config = textwrap.dedent("""\
        model: unet3d
        framework: pytorch
        workflow: {train: True, checkpoint: True}
        dataset: {format: npz, num_files_train: 10, record_length: 1000, record_length_stdev: 10,
                  record_length_resize: 64}
        reader: {data_loader: pytorch, read_threads: 0, prefetch_size: 0, sample_shuffle: off}
        train: {computation_time: 0.5, computation_time_stdev: 0.1}
        checkpoint: {model_size: 4096, steps_between_checkpoints: 3, epochs_between_checkpoints: 2}
        output: {folder: out}
        """)
    model = import_dlio(write(tmp_path, config))
    assert model.model.name == "unet3d" and model.model.model_size == 4096
    assert model.dataset.record_length == Distribution(type="normal", mean=1000, stdev=10)
    assert model.dataset.record_length_resize == 64
    assert model.reader.sample_shuffle == "off" and model.reader.prefetch_factor == 2  # 0 means 2
    assert model.train.computation_time == Distribution(type="normal", mean=0.5, stdev=0.1)
    ck = model.checkpoint
    assert ck.steps_between_checkpoints == 3 and ck.epochs_between_checkpoints is None
    # sized in `checkpoint`, not in `model`: DLIO 2.0.0's sizing, its default layer file included
    assert (ck.bytes_per_checkpoint, ck.files_per_checkpoint) == (4096 + 17371 + 24740228, 2)
    notes = "\n".join(model.provenance.notes)
    assert "several checkpoint intervals given" in notes
    assert "DLIO keys without effect on the model: output" in notes


def test_import_without_a_framework_takes_dlios_default(tmp_path: Path) -> None:
    """A config may leave ``framework`` out (DLIO's default is tensorflow); the importer's key
    lookup once read a missing top-level key as an empty mapping ("framework: expected a
    string, got {}")."""
    model = import_dlio(write(tmp_path, "dataset: {format: npz, num_files_train: 2}\n"))
    assert model.framework == "tensorflow"
    assert model.provenance.fields["framework"].confidence == "default"


def test_import_notes_ignored_and_mapped_keys(tmp_path: Path) -> None:
    config = textwrap.dedent("""\
        framework: pytorch
        dataset: {format: mmap_indexed_binary, file_prefix: img, keep_files: True, num_files_train: 1,
                  num_samples_per_file: 1048576, record_length_bytes: 2048}
        reader: {data_loader: pytorch, batch_size: 16}
        train: {epoch: 5}
        profiling: {profiler: iostat}
        """)
    model = import_dlio(write(tmp_path, config))
    assert model.dataset.format == "indexed_binary"
    notes = "\n".join(model.provenance.notes)
    assert "dataset.format mmap_indexed_binary imported as indexed_binary" in notes
    for key in ("dataset.file_prefix", "dataset.keep_files", "train.epoch", "profiling"):
        assert key in notes


@pytest.mark.parametrize(
    ("config", "key", "message"),
    [
        (
            "reader: {batch_size: two}",
            "reader.batch_size",
            "expected a positive integer, got 'two'",
        ),
        (
            "reader: {read_threads: -1}",
            "reader.read_threads",
            "expected a non-negative integer, got -1",
        ),
        ("reader: {data_loader: jax}", "reader.data_loader", "expected one of tensorflow, pytorch"),
        (
            "reader: {file_shuffle: sometimes}",
            "reader.file_shuffle",
            "expected one of off, seed, random",
        ),
        ("dataset: {format: zarr}", "dataset.format", "expected one of tfrecord"),
        ("dataset: {format: synthetic}", "dataset.format", "synthetic data has no files to replay"),
        (
            "dataset: {num_files_train: 0}",
            "dataset.num_files_train",
            "expected a positive integer, got 0",
        ),
        (
            "train: {computation_time: {type: lognormal, mean: 1}}",
            "train.computation_time.type",
            "expected one of normal, uniform, gamma, exponential, poisson, fixed",
        ),
        (
            "train: {computation_time: {type: gamma, shape: 2}}",
            "train.computation_time.scale",
            "missing required key for type gamma",
        ),
        (
            "train: {computation_time: {type: uniform, min: 3, max: 1}}",
            "train.computation_time.max",
            "expected max >= min",
        ),
        (
            "train: {computation_time: [1, 2]}",
            "train.computation_time",
            "expected a number of seconds",
        ),
        ("workflow: {train: maybe}", "workflow.train", "expected true or false"),
        ("framework: jax", "framework", "expected one of pytorch, tensorflow"),
        ("reader: |\n  batch_size: [1\n", "reader", "not valid YAML inside the block string"),
        ("reader: 5", "reader", "expected a mapping, got 5"),
        ("- 1\n", "(top level)", "expected a DLIO workload mapping"),
    ],
)
def test_import_errors_name_file_and_key(
    tmp_path: Path, config: str, key: str, message: str
) -> None:
    path = write(
        tmp_path,
        "framework: pytorch\n" + config + "\n"
        if not config.startswith(("framework", "-"))
        else config + "\n",
    )
    with pytest.raises(ModelError) as info:
        import_dlio(path)
    assert str(info.value).startswith(f"{path}: {key}: ")
    assert message in str(info.value)


def test_import_unparsable_file(tmp_path: Path) -> None:
    path = write(tmp_path, "dataset: {format: npz\n")
    with pytest.raises(ModelError, match="not valid YAML"):
        import_dlio(path)


# --------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("name", list(CONFIGS))
def test_round_trip(tmp_path: Path, name: str) -> None:
    first = import_dlio(write(tmp_path, CONFIGS[name]))
    second, warnings, exported = round_trip(tmp_path, first)
    assert comparable(second) == comparable(first)
    allowed_only(exported)
    assert not any("empirical" in w for w in warnings)


def test_cosmoflow_and_resnet_details(tmp_path: Path) -> None:
    cosmo = import_dlio(write(tmp_path, COSMOFLOW, "cosmo.yaml"))
    lay = cosmo.dataset.layout
    assert (
        lay.hdf5_compression,
        lay.compression_level,
        lay.hdf5_chunk_bytes,
        lay.hdf5_chunk_shape,
    ) == ("gzip", 4, 1048576, [1, 128, 128, 4])
    assert cosmo.dataset.num_samples_per_file == 4 and cosmo.dataset.num_files_eval == 64
    assert cosmo.dataset.file_size.mean == pytest.approx(4 * 2828486)
    assert cosmo.reader.transfer_size == Distribution.fixed(1048576)
    assert cosmo.reader.prefetch_factor == 2 and cosmo.reader.shuffle_seed == 7
    assert cosmo.train.computation_time == Distribution(type="gamma", shape=2.0, scale=0.0175)
    assert cosmo.train.evaluation == Evaluation(
        every_n_epochs=2, after_epoch=1, computation_time=Distribution.fixed(0.011)
    )
    resnet = import_dlio(write(tmp_path, RESNET, "resnet.yaml"))
    assert resnet.framework == "tensorflow" and resnet.reader.worker_kind == "thread"
    assert resnet.reader.prefetch_factor == 4  # tf.data: prefetch_size as is
    assert resnet.dataset.num_subfolders == 1000 and resnet.reader.shuffle_size == 1024
    assert resnet.reader.preprocess_time == Distribution(type="normal", mean=0.0003, stdev=0.0001)
    assert resnet.train.total_training_steps == 5000


COMPUTATION_TIME_FORMS = {
    "fixed number": ("0.25", Distribution.fixed(0.25)),
    "fixed mean": ("{mean: 0.25}", Distribution.fixed(0.25)),
    "fixed typed": ("{type: fixed, value: 0.25}", Distribution.fixed(0.25)),
    "normal": (
        "{type: normal, mean: 0.25, stdev: 0.05}",
        Distribution(type="normal", mean=0.25, stdev=0.05),
    ),
    "normal untyped": (
        "{mean: 0.25, stdev: 0.05}",
        Distribution(type="normal", mean=0.25, stdev=0.05),
    ),
    "uniform": (
        "{type: uniform, min: 0.2, max: 0.3}",
        Distribution(type="uniform", min=0.2, max=0.3),
    ),
    "gamma": (
        "{type: gamma, shape: 4.0, scale: 0.0625}",
        Distribution(type="gamma", shape=4.0, scale=0.0625),
    ),
    "exponential": (
        "{type: exponential, scale: 0.25}",
        Distribution(type="exponential", scale=0.25),
    ),
    "poisson": ("{type: poisson, lam: 3}", Distribution(type="poisson", lam=3.0)),
    "poisson lambda": ("{type: poisson, lambda: 3}", Distribution(type="poisson", lam=3.0)),
}


@pytest.mark.parametrize("form", list(COMPUTATION_TIME_FORMS))
def test_computation_time_forms_round_trip(tmp_path: Path, form: str) -> None:
    text, expected = COMPUTATION_TIME_FORMS[form]
    config = UNET3D.replace("computation_time: 0.636", f"computation_time: {text}")
    first = import_dlio(write(tmp_path, config))
    assert first.train.computation_time == expected
    second, _, exported = round_trip(tmp_path, first)
    assert second.train.computation_time == expected
    assert comparable(second) == comparable(first)
    allowed_only(exported)
    spec = exported["train"]["computation_time"]
    assert isinstance(spec, float) if expected.type == "fixed" else spec["type"] == expected.type


def test_computation_time_stdev_key_round_trips(tmp_path: Path) -> None:
    config = UNET3D.replace(
        "computation_time: 0.636", "computation_time: 0.636\n  computation_time_stdev: 0.02"
    )
    first = import_dlio(write(tmp_path, config))
    assert first.train.computation_time == Distribution(type="normal", mean=0.636, stdev=0.02)
    second, _, _ = round_trip(tmp_path, first)
    assert comparable(second) == comparable(first)


# --------------------------------------------------------------------------- export of dlreplay models


def trace_like_model(tmp_path: Path) -> WorkloadModel:
    """A model as distillation would produce: measured distributions and facts DLIO lacks."""
    base = import_dlio(write(tmp_path, UNET3D, "base.yaml"))
    return dataclasses.replace(
        apply_overrides(
            base,
            [
                "dataset.format=raw",
                "reader.open_per_sample=false",
                "processes.ranks=8",
                "checkpoint.write_transfer_size=1048576",
                "reader.access_pattern.sequential=1.0",
                "reader.worker_kind=thread",
                "train.steps_per_epoch=24",
            ],
        ),
        train=dataclasses.replace(
            base.train,
            steps_per_epoch=24,
            computation_time=Distribution.from_values([0.5, 0.6, 0.7, 0.62]),
        ),
    )


def test_export_lossy_steps_are_warned_and_commented(tmp_path: Path) -> None:
    model = trace_like_model(tmp_path)
    out = tmp_path / "dlio.yaml"
    warnings = export_dlio(model, out)
    text = "\n".join(warnings)
    assert "train.computation_time: empirical distribution exported as normal" in text
    assert "dataset.format raw exported as npy" in text
    assert "train.steps_per_epoch=24 has no DLIO key" in text
    assert "silences between its reads" not in text  # (a model with loader events)
    timed = dataclasses.replace(
        model, train=dataclasses.replace(model.train, timed_between_reads=True)
    )
    assert any("silences between its reads" in w for w in export_dlio(timed, tmp_path / "t.yaml"))
    for lost in (
        "reader.worker_kind=thread",
        "reader.open_per_sample=false",
        "reader.access_pattern",
        "checkpoint.write_transfer_size",
        "processes.ranks=8 (run DLIO with mpirun -np 8)",
    ):
        assert lost in text
    content = out.read_text()
    assert all(f"# lossy: {w}" in content for w in warnings)
    exported = yaml.safe_load(content)
    allowed_only(exported)
    assert exported["dataset"]["format"] == "npy"
    ct = model.train.computation_time
    assert exported["train"]["computation_time"] == {
        "type": "normal",
        "mean": ct.mean,
        "stdev": ct.stdev,
    }
    again = import_dlio(out)
    assert again.train.computation_time == Distribution(type="normal", mean=ct.mean, stdev=ct.stdev)


def test_raw_with_several_samples_exports_as_indexed_binary(tmp_path: Path) -> None:
    model = apply_overrides(trace_like_model(tmp_path), ["dataset.num_samples_per_file=16"])
    cfg, warnings = model_to_dlio(model)
    assert cfg["dataset"]["format"] == "indexed_binary"
    assert any("raw exported as indexed_binary" in w for w in warnings)


def test_export_unknown_and_bounded_distributions(tmp_path: Path) -> None:
    model = import_dlio(write(tmp_path, COSMOFLOW))
    model = dataclasses.replace(
        model,
        train=dataclasses.replace(
            model.train,
            computation_time=Distribution.unknown(),
            evaluation=dataclasses.replace(
                model.train.evaluation,
                steps=3,
                computation_time=Distribution(type="normal", mean=1, stdev=1, min=0),
            ),
        ),
    )
    cfg, warnings = model_to_dlio(model)
    assert "computation_time" not in cfg["train"]
    assert cfg["evaluation"]["eval_time"] == {"type": "normal", "mean": 1.0, "stdev": 1.0}
    text = "\n".join(warnings)
    assert "train.computation_time is unknown: left out" in text
    assert "min/max bounds dropped" in text
    assert "train.evaluation.steps has no DLIO key" in text
    allowed_only(cfg)


def test_export_native_loader_and_checkpoint_size(tmp_path: Path) -> None:
    model = model_from_dict(
        {
            "schema": "dlreplay.workload",
            "format_version": 1,
            "dataset": {
                "format": "npz",
                "num_files": 4,
                "num_samples_per_file": 1,
                "record_length": 1000,
                "layout": {"compressed": True, "records_per_file": 2},
            },
            "reader": {"data_loader": "native", "read_threads": 0, "prefetch_factor": 3},
            "checkpoint": {
                "enabled": True,
                "steps_between_checkpoints": 2,
                "bytes_per_checkpoint": 5000,
                "files_per_checkpoint": 3,
            },
        }
    )
    cfg, warnings = model_to_dlio(model)
    assert cfg["reader"]["data_loader"] == "pytorch" and cfg["reader"]["prefetch_size"] == 3
    assert cfg["dataset"]["compression"] == "zip"
    assert cfg["model"] == {"model_size_bytes": 5000}
    assert cfg["checkpoint"]["steps_between_checkpoints"] == 2
    text = "\n".join(warnings)
    assert "reader.data_loader native exported as pytorch" in text
    assert "records_per_file has no DLIO key" in text
    assert (
        "DLIO will write about 5000 bytes in 1 file(s) per checkpoint; the model says 5000 bytes in 3"
        in text
    )
    assert "for it, set checkpoint.model_size: 5000 and checkpoint.num_layers: 0" in text
    allowed_only(cfg)
    again = dlio_to_model(cfg)
    assert again.dataset.layout.compressed and again.checkpoint.bytes_per_checkpoint == 5000
    # the warning's advice, read as DLIO 2.0.0 reads it: the same bytes, no layer file
    old = {k: v for k, v in cfg.items() if k != "model"}
    old["checkpoint"] = {**cfg["checkpoint"], "model_size": 5000, "num_layers": 0}
    ck = dlio_to_model(old, dlio_version="2.0.0").checkpoint
    assert (ck.bytes_per_checkpoint, ck.files_per_checkpoint) == (5000, 1)


def test_exported_model_file_round_trip_with_save(tmp_path: Path) -> None:
    """import → save_model → load_model → export: the workload model file is lossless."""
    model = import_dlio(write(tmp_path, COSMOFLOW))
    save_model(model, tmp_path / "model.yaml")
    loaded = load_model(tmp_path / "model.yaml")
    assert loaded == model
    assert model_to_dlio(loaded) == model_to_dlio(model)


def test_key_problems_detects_foreign_keys() -> None:
    assert dlio_key_problems({"framework": "jax"}) == [
        "framework: 'jax' not one of ('pytorch', 'tensorflow')"
    ]
    problems = dlio_key_problems(
        {
            "dataset": {"format": "raw", "num_files": 3},
            "train": {"computation_time": {"type": "empirical", "mean": 1}},
            "model": {"parallelism": {"tensor": 2, "expert": 4}},
            "replay": {},
        }
    )
    assert problems == [
        "dataset.format: 'raw' not one of " + str(DLIO_ENUM_VALUES["dataset.format"]),
        "dataset.num_files: not a key DLIO reads",
        "train.computation_time.type: 'empirical' not one of "
        "['exponential', 'gamma', 'normal', 'poisson', 'uniform']",
        "model.parallelism.expert: not a key DLIO reads",
        "replay: not a DLIO section",
    ]


def test_access_pattern_default_is_unknown_after_import(tmp_path: Path) -> None:
    model = import_dlio(write(tmp_path, RESNET))
    assert model.reader.access_pattern == AccessPattern()
    assert not model.reader.transfer_size.is_known


def test_fields_without_dlio_key_say_so(tmp_path: Path) -> None:
    model = import_dlio(write(tmp_path, UNET3D))
    fields = model.provenance.fields
    assert fields["reader.open_per_sample"].method == "no DLIO key; dlreplay default"
    assert fields["train.total_training_steps"].method == "not in the DLIO config; dlreplay default"
    assert fields["reader.shuffle_seed"].method == "DLIO default"


def test_huge_model_size_is_exact(tmp_path: Path) -> None:
    big = 2**60 + 1
    model = import_dlio(
        write(tmp_path, UNET3D.replace("model_size: 499153191", f"model_size: {big}"))
    )
    assert model.model.model_size == big == model.checkpoint.bytes_per_checkpoint
    second, _, exported = round_trip(tmp_path, model)
    assert exported["model"]["model_size_bytes"] == big
    assert comparable(second) == comparable(model)
