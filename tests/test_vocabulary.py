"""The one event vocabulary: DFTracer's AI conventions, DLIO's events and dlreplay's own names.

Unit tests on hand-built tables, then the foreign corpus (real DLIO 2.0.0 runs traced by
DLIO, a job annotated by hand with ``dftracer.python.ai``) through the loader, the passes,
distill and every command, against DLIO's own configuration and printed metrics.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from dlreplay.analyze import load_trace
from dlreplay.analyze.distill import distill
from dlreplay.analyze.passes import au_dlio, characterize
from dlreplay.analyze.trace import vocabulary as voc
from dlreplay.schema import EVENT_SCHEMA

from .conftest import TRACES

DLIO = sorted(p.parent for p in TRACES.glob("dlio_*/dlio_config.yaml"))
FOREIGN = [*DLIO, TRACES / "ai_annotated"]


def table(rows: list[dict]) -> pl.DataFrame:
    return pl.DataFrame([{c: r.get(c) for c in EVENT_SCHEMA} for r in rows], schema=EVENT_SCHEMA)


def ev(cat: str, name: str, ts: int, dur: int, pid: int = 10, tid: int | None = None, **kw) -> dict:
    return {
        "pid": pid,
        "tid": pid if tid is None else tid,
        "host": "h",
        "ts": ts,
        "dur": dur,
        "cat": cat,
        "name": name,
        **kw,
    }


# ---------------------------------------------------------------------------------------
# Spellings


AI_CASES = [
    # (cat, name, role): DFTracer's AI conventions, every category and form
    ("compute", "compute", voc.COMPUTE),
    ("compute", "forward", voc.FORWARD),
    ("compute", "backward", voc.BACKWARD),
    ("compute", "step", voc.OPTIMIZER),
    ("compute", "compute.block", voc.COMPUTE),
    ("data", "item", voc.ITEM),
    ("data", "preprocess", voc.PREPROCESS),
    ("data", "preprocess.collate", voc.PREPROCESS),
    ("data", "item.init", voc.INIT),
    ("data", "io.read", voc.DATA_IO),
    ("data", "data", voc.INTERNAL),
    ("dataloader", "fetch", voc.FETCH),
    ("dataloader", "fetch.iter", voc.FETCH),
    ("dataloader", "fetch.block", voc.STEP),
    ("dataloader", "fetch.yield", voc.STEP),
    ("dataloader", "dataloader", voc.FETCH),
    *[
        ("comm", n, voc.COMM)
        for n in (
            "send",
            "receive",
            "barrier",
            "bcast",
            "reduce",
            "all_reduce",
            "gather",
            "all_gather",
            "scatter",
            "reduce_scatter",
            "all_to_all",
            "comm",
        )
    ],
    ("comm", "all_reduce.block", voc.COMM),
    ("device", "transfer", voc.DEVICE),
    ("device", "device", voc.DEVICE),
    ("pipeline", "epoch", voc.EPOCH),
    ("pipeline", "epoch.block", voc.EPOCH),
    ("pipeline", "epoch.iter", voc.EPOCH_GAP),
    ("pipeline", "train", voc.TRAIN),
    ("pipeline", "evaluate", voc.EVALUATE),
    ("pipeline", "test", voc.TEST),
    ("checkpoint", "checkpoint", voc.CKPT_SAVE),
    ("checkpoint", "capture", voc.CKPT_SAVE),
    ("checkpoint", "restart", voc.CKPT_LOAD),
    ("checkpoint", "io.write", voc.CKPT_IO),
    ("other", "log", voc.INTERNAL),
    ("ai_root", "ai_root", voc.INTERNAL),
    # DLIO 2.0.0 (pydftracer 1.0.x)
    ("dlio_benchmark", "DLIOBenchmark._train", voc.TRAIN),
    ("dlio_benchmark", "DLIOBenchmark._eval", voc.EVALUATE),
    ("dlio_benchmark", "<module>.iter", voc.FETCH),
    ("dlio_benchmark", "<module>.yield", voc.STEP),
    ("dlio_benchmark", "DLIOBenchmark.run", voc.INTERNAL),
    ("ai_framework", "TorchFramework.compute", voc.COMPUTE),
    ("ai_framework", "TorchFramework.trace_object", voc.INTERNAL),
    ("data_loader", "TorchDataset.__getitem__", voc.ITEM),
    ("data_loader", "TorchDataLoader.next", voc.INTERNAL),
    ("reader", "NPZReader.read_index", voc.SAMPLE_READ),
    ("reader", "HDF5Reader.read_index", voc.SAMPLE_READ),
    ("reader", "FormatReader.preprocess", voc.PREPROCESS),
    ("reader", "ImageReader.open", voc.INTERNAL),
    ("checkpoint", "PyTorchCheckpointing.checkpoint", voc.CKPT_SAVE),
    ("checkpoint", "PyTorchCheckpointing.save_state", voc.CKPT_IO),
    ("storage", "FileStorage.get_uri", voc.INTERNAL),
    ("config", "ConfigArguments.validate", voc.INTERNAL),
    # dlreplay's own capture, before and after DFTracer's conventions
    ("checkpoint", "save", voc.CKPT_SAVE),
    ("checkpoint", "load", voc.CKPT_LOAD),
    ("data", "items", voc.ITEMS),
    ("dataloader", "fetch.stop", voc.FETCH),
    # not annotations, or not understood
    ("POSIX", "read", None),
    ("STDIO", "fread", None),
    ("MPI", "MPI_Barrier", None),
    ("dftracer", "start", None),
    ("user", "augment", None),
    ("compute", "mystery", None),
    ("myapp", "Trainer.fit", None),
]


@pytest.mark.parametrize(("cat", "name", "role"), AI_CASES, ids=lambda x: str(x))
def test_classify(cat: str, name: str, role: str | None) -> None:
    assert voc.classify(cat, name) == role


def test_legacy_compute_step_is_a_training_step_only_where_dlreplay_wrote_it() -> None:
    rows = [
        # pid 1: dlreplay format_version 1 (fetch + compute/step): a training step
        ev("dataloader", "fetch", 0, 10, pid=1, batch_size=2, epoch=0, step=0),
        ev("compute", "step", 10, 50, pid=1, epoch=0, step=0),
        # pid 2: DFTracer's conventions: compute.step is the optimizer step inside compute
        ev("dataloader", "fetch.iter", 0, 10, pid=2),
        ev("compute", "compute", 10, 50, pid=2),
        ev("compute", "step", 50, 5, pid=2),
    ]
    out, _ = voc.canonicalize(table(rows))
    roles = dict(zip(zip(out["pid"], out["name"], strict=True), out["role"], strict=True))
    assert roles[(1, "step")] == voc.STEP
    assert roles[(2, "step")] == voc.OPTIMIZER


def test_unknown_annotations_are_listed() -> None:
    rows = [
        ev("user", "augment", 0, 1),
        ev("user", "augment", 5, 1),
        ev("POSIX", "read", 0, 1),
        ev("compute", "compute", 0, 1),
        ev("MPI", "MPI_Send", 0, 1),
    ]
    out, _ = voc.canonicalize(table(rows))
    assert voc.unknown_annotations(out) == [{"cat": "user", "name": "augment", "count": 2}]


# ---------------------------------------------------------------------------------------
# The loader hook


def test_rank_pids_are_split_by_thread() -> None:
    """DFTracer 1.x Python API with process_id=rank: pid is the rank, workers share its file."""
    rows = [
        ev("dlio_benchmark", "DLIOBenchmark._train", 100, 1000, pid=0, tid=500),
        ev("ai_framework", "TorchFramework.compute", 300, 50, pid=0, tid=500),
        ev("data_loader", "TorchDataset.__getitem__", 150, 20, pid=0, tid=501),
        ev("POSIX", "read", 155, 5, pid=0, tid=501, file="/d/a.npz", size=10),
        ev("data_loader", "TorchDataset.__getitem__", 160, 20, pid=0, tid=502),
    ]
    out, changed = voc.canonicalize(table(rows))
    assert changed
    assert sorted(out["pid"].unique().to_list()) == [500, 501, 502]
    ppid = dict(zip(out["pid"], out["ppid"], strict=True))
    assert ppid[501] == ppid[502] == 500 and ppid[500] is None
    # a real process (main thread's tid == pid) is left alone
    same, changed = voc.canonicalize(
        table([ev("compute", "compute", 0, 1, pid=7), ev("POSIX", "read", 0, 1, pid=0, tid=0)])
    )
    assert not changed and sorted(same["pid"].to_list()) == [0, 7]


def test_rank_pids_stay_apart_when_two_ranks_share_a_thread_id() -> None:
    """Two DLIO ranks on one node whose forked reader workers both wrote tid 22386 (pydftracer
    1.0.2, seen in a real 2-rank run): four processes, each worker under its own rank."""
    rows = [
        ev("dlio_benchmark", "DLIOBenchmark._train", 100, 1000, pid=0, tid=22359),
        ev("dlio_benchmark", "DLIOBenchmark._train", 100, 1000, pid=1, tid=22361),
        *[
            ev("data_loader", "TorchDataset.__getitem__", 150 + i, 20, pid=r, tid=22386)
            for r in (0, 1)
            for i in range(3)
        ],
        ev("POSIX", "read", 155, 5, pid=0, tid=22386, file="/d/a.npz", size=10),
        ev("POSIX", "read", 156, 5, pid=1, tid=22386, file="/d/b.npz", size=10),
    ]
    out, changed = voc.canonicalize(table(rows))
    assert changed
    procs = out.select("pid", "ppid").unique()
    assert procs.height == 4 and out["pid"].n_unique() == 4
    workers = (
        out.filter(pl.col("name") == "TorchDataset.__getitem__")
        .group_by("pid")
        .agg(pl.col("ppid").unique().alias("ppid"), pl.len())
    )
    assert sorted(p for ps in workers["ppid"].to_list() for p in ps) == [22359, 22361]
    assert workers["len"].to_list() == [3, 3]
    # each rank's read stays with that rank's worker
    reads = out.filter(pl.col("name") == "read").select("file", "ppid").sort("file")
    assert reads.rows() == [("/d/a.npz", 22359), ("/d/b.npz", 22361)]
    assert not set(workers["pid"].to_list()) & {22359, 22361}


def test_loop_numbers_sample_indices_and_checkpoint_bytes_are_filled() -> None:
    rows = [
        ev("dlio_benchmark", "DLIOBenchmark._train", 0, 100, pid=5),
        ev("dlio_benchmark", "DLIOBenchmark._train", 200, 100, pid=5),
        *[
            ev("ai_framework", "TorchFramework.compute", t, 5, pid=5)
            for t in (10, 30, 50, 210, 230)
        ],
        ev("checkpoint", "PyTorchCheckpointing.checkpoint", 60, 20, pid=5),
        ev("POSIX", "write", 62, 3, pid=5, file="/ck/a.pt", size=1000),
        ev("POSIX", "write", 70, 3, pid=5, file="/ck/a.pt", size=24),
        ev("POSIX", "write", 90, 3, pid=5, file="/log", size=7),  # after the save
        ev("data_loader", "TorchDataset.__getitem__", 5, 4, pid=6, ppid=5),
        ev("reader", "NPZReader.read_index", 6, 2, pid=6, ppid=5, sample_index=42),
    ]
    out, _ = voc.canonicalize(table(rows))
    comp = out.filter(pl.col("role") == voc.COMPUTE).sort("ts")
    assert comp["epoch"].to_list() == [0, 0, 0, 1, 1]
    assert comp["step"].to_list() == [0, 1, 2, 0, 1]
    assert out.filter(pl.col("role") == voc.ITEM)["sample_index"].to_list() == [42]
    assert out.filter(pl.col("role") == voc.CKPT_SAVE)["size"].to_list() == [1024]


def test_start_stop_metadata_markers_become_epochs() -> None:
    """``ai.pipeline.epoch.start(metadata=True)`` writes CM records, not events."""
    meta = pl.DataFrame(
        {
            "src": [0, 0, 0, 0],
            "pid": [3, 3, 3, 3],
            "tid": [3, 3, 3, 3],
            "name": ["CM"] * 4,
            "a_name": ["epoch.start", "epoch.end", "epoch.start", "epoch.end"],
            "a_value": ["100", "200", "300", "450"],
        }
    )
    spans = voc.marker_spans(meta)
    assert spans.select("ts", "dur").rows() == [(100, 100), (300, 150)]
    rows = [ev("dataloader", "fetch.iter", t, 5, pid=3, batch_size=4) for t in (110, 140, 310, 350)]
    rows += [ev("dataloader", "fetch.block", t + 5, 20, pid=3) for t in (110, 140, 310, 350)]
    out, changed = voc.canonicalize(table(rows), spans, ["t.pfw"])
    assert changed
    epochs = out.filter(pl.col("role") == voc.EPOCH)
    assert epochs.select("cat", "name", "ts", "dur").rows() == [
        ("pipeline", "epoch", 100, 100),
        ("pipeline", "epoch", 300, 150),
    ]
    assert out.filter(pl.col("role") == voc.STEP).sort("ts")["epoch"].to_list() == [0, 0, 1, 1]
    # markers never double events the process already has
    again, _ = voc.canonicalize(out.drop("role"), spans, ["t.pfw"])
    assert again.filter(pl.col("role") == voc.EPOCH).height == 2


# ---------------------------------------------------------------------------------------
# Training steps


def test_training_steps_wait_compute_checkpoint_and_other() -> None:
    """DLIO 2.0.0's shape: compute events, fetch waits except the epoch's last batch, a
    checkpoint after a step, a barrier between compute and the next fetch."""
    rows = [
        ev("dlio_benchmark", "DLIOBenchmark._train", 0, 1000, pid=1),
        ev("dlio_benchmark", "<module>.iter", 10, 90, pid=1),  # first batch: 90 wait
        ev("ai_framework", "TorchFramework.compute", 100, 100, pid=1),
        ev("dlio_benchmark", "<module>.iter", 210, 40, pid=1),  # barrier 10, wait 40
        ev("ai_framework", "TorchFramework.compute", 250, 100, pid=1),
        ev("checkpoint", "PyTorchCheckpointing.checkpoint", 360, 200, pid=1),
        ev("dlio_benchmark", "<module>.iter", 570, 30, pid=1),
        ev("ai_framework", "TorchFramework.compute", 600, 100, pid=1),
        ev(
            "ai_framework", "TorchFramework.compute", 760, 100, pid=1
        ),  # last batch: no fetch logged
    ]
    out, _ = voc.canonicalize(table(rows))
    st = voc.training_steps(out)
    assert st.select("wait_us", "compute_us", "ckpt_us", "other_us").rows() == [
        (90, 100, 0, 0),
        (40, 100, 0, 10),
        (30, 100, 200, 20),
        (60, 100, 0, 0),
    ]
    assert st["block_first"].to_list() == [True, False, True, False]
    assert st["lead_in_us"].to_list() == [10, 0, 0, 0]
    assert st["basis"].unique().to_list() == ["compute events"]


def test_training_steps_of_dlreplay_captures_both_spellings() -> None:
    old = [
        ev("pipeline", "epoch", 0, 500, epoch=0),
        ev("dataloader", "fetch", 10, 20, epoch=0, step=0, batch_size=2),
        ev("compute", "step", 30, 100, epoch=0, step=0),
        ev("checkpoint", "save", 60, 30, size=99),
        ev("dataloader", "fetch", 130, 5, epoch=0, step=1, batch_size=2),
        ev("compute", "step", 135, 100, epoch=0, step=1),
        ev("dataloader", "fetch", 235, 1, epoch=0, step=2, batch_size=0),
    ]
    new = [
        {
            **r,
            "name": {"fetch": "fetch.iter", "step": "fetch.block", "save": "capture"}[r["name"]],
            "cat": "dataloader" if r["name"] in ("fetch", "step") else r["cat"],
        }
        if r["name"] in ("fetch", "step", "save")
        else r
        for r in old
    ]
    new[-1]["name"] = "fetch.stop"
    results = []
    for rows in (old, new):
        out, _ = voc.canonicalize(table(rows))
        st = voc.training_steps(out)
        results.append(
            st.select("wait_us", "compute_us", "ckpt_us", "other_us", "batch_size").rows()
        )
    assert results[0] == results[1] == [(20, 70, 30, 0, 2), (5, 100, 0, 0, 2)]


def test_training_step_count_is_the_rows_of_training_steps() -> None:
    """The summary counts steps without building the table: the same count on every committed
    trace and on the hand-built shapes above (an empty table, fetch waits only, nested computes)."""
    nested = [
        ev("ai_framework", "TorchFramework.compute", 0, 100, pid=1),
        ev("ai_framework", "TorchFramework.compute", 10, 20, pid=1),  # inside the first: one step
        ev("ai_framework", "TorchFramework.compute", 150, 10, pid=1),
    ]
    fetch_only = [ev("dataloader", "fetch", t, 5, epoch=0, batch_size=2) for t in (0, 10, 20)]
    tables = [voc.canonicalize(table(rows))[0] for rows in ([], nested, fetch_only)]
    runs = sorted({f.parent for f in TRACES.rglob("*.pfw*")})  # each run on its own
    tables += [load_trace(p).events for p in runs]
    counts = [(voc.training_step_count(t), voc.training_steps(t).height) for t in tables]
    assert all(a == b for a, b in counts), counts
    assert counts[1][0] == 2 and counts[2][0] == 2 and sum(a for a, _ in counts) > 100


def test_au_dlio_reproduces_dlios_formula() -> None:
    """Per block: compute of all steps but the first over the block's time after the first step."""
    rows = [ev("dlio_benchmark", "DLIOBenchmark._train", 0, 10_000, pid=1)]
    t = 100
    for _ in range(4):  # wait 25, compute 100, barrier 0
        rows += [
            ev("dlio_benchmark", "<module>.iter", t, 25, pid=1),
            ev("ai_framework", "TorchFramework.compute", t + 25, 100, pid=1),
        ]
        t += 125
    out, _ = voc.canonicalize(table(rows))
    c = characterize(out, passes=["steps"])
    assert c["steps"]["au_dlio"] == pytest.approx(300 / 375)
    assert au_dlio(c.view.step_table) == c["steps"]["au_dlio"]


def test_au_dlio_with_saves_inside_loop_bodies() -> None:
    """A save at the end of a loop body (a replay's, a script's) ends DLIO's block as a save after
    the step does: the next step starts a block, and the save's time is in neither block."""

    def steps(save_inside: bool) -> pl.DataFrame:
        rows = [ev("pipeline", "epoch", 0, 10_000, epoch=0)]
        t = 100
        for k in range(6):  # wait 25, compute 100; a 50 us save after the third step
            rows.append(ev("dataloader", "fetch.iter", t, 25, epoch=0, step=k, batch_size=2))
            t += 25
            save = 50 if k == 2 else 0
            rows.append(
                ev(
                    "dataloader",
                    "fetch.block",
                    t,
                    100 + (save if save_inside else 0),
                    epoch=0,
                    step=k,
                )
            )
            if save:
                rows.append(ev("checkpoint", "capture", t + 100, save))
            t += 100 + save
        out, _ = voc.canonicalize(table(rows))
        return voc.training_steps(out)

    inside, after = steps(True), steps(False)
    assert (
        inside["block_first"].to_list()
        == after["block_first"].to_list()
        == [True, False, False, True, False, False]
    )
    assert inside["compute_us"].to_list() == after["compute_us"].to_list() == [100] * 6
    # DLIO's formula: the wait after the save (25 us) comes off the second block twice
    assert (
        au_dlio(inside)
        == pytest.approx(au_dlio(after))
        == pytest.approx((200 / 250 + 200 / 225) / 2, abs=1e-4)
    )


# ---------------------------------------------------------------------------------------
# The foreign corpus


def _expected(trace: Path) -> dict:
    return json.loads((trace / "expected.json").read_text())


def test_foreign_corpus_is_present() -> None:
    assert {p.name for p in DLIO} == {
        "dlio_npz_starved",
        "dlio_h5_multi",
        "dlio_jpeg_ckpt",
        "dlio_npz_2ranks",
        "dlio_ib_multi",
        "dlio_npz_eval",
        "dlio_ib_mmap",
        "dlio_npy_small",
    }
    assert (TRACES / "ai_annotated" / "expected.json").is_file()


@pytest.mark.parametrize("trace", FOREIGN, ids=lambda p: p.name)
def test_distill_recovers_the_workload(trace: Path) -> None:
    truth = _expected(trace)["model"]
    lt = load_trace(trace)
    assert not lt.damaged
    m = distill(lt.events, source=str(trace))
    d, r, t, c = m.dataset, m.reader, m.train, m.checkpoint
    # DLIO's mmap_indexed_binary is indexed_binary whose reader maps the files
    mapped = truth["format"] == "mmap_indexed_binary"
    assert (d.format, d.num_files, d.num_samples_per_file) == (
        "indexed_binary" if mapped else truth["format"],
        truth["num_files"],
        truth["num_samples_per_file"],
    )
    assert r.memory_map == mapped
    assert (r.batch_size, r.read_threads, t.epochs) == (
        truth["batch_size"],
        truth["read_threads"],
        truth["epochs"],
    )
    # DLIO sleeps its computation_time; on a loaded machine the sleeps overshoot and the
    # trace's compute events (what distill measures) are longer than the configured value
    lt_compute = voc.training_steps(lt.events)
    took = float(lt_compute["compute_us"].mean()) * 1e-6
    assert t.computation_time.mean == pytest.approx(took, rel=0.05)
    if took < truth["computation_time"] * 1.03:
        assert t.computation_time.mean == pytest.approx(truth["computation_time"], rel=0.05)
    assert (c.steps_between_checkpoints or 0) == truth["steps_between_checkpoints"]
    assert m.processes.ranks == truth.get("ranks", 1)
    # evaluation passes (their own loader over valid/, their own step time) are modelled apart:
    # the training fields above hold without them
    if "num_files_eval" in truth:
        ev = t.evaluation
        assert ev is not None and (d.num_files_eval, r.batch_size_eval) == (
            truth["num_files_eval"],
            truth["batch_size_eval"],
        )
        assert (ev.every_n_epochs, ev.after_epoch) == (truth["epochs_between_evals"], 1)
        assert (
            ev.steps
            == truth["num_files_eval"] * truth["num_samples_per_file"] // truth["batch_size_eval"]
        )
        assert ev.computation_time.mean == pytest.approx(truth["eval_time"], rel=0.05)
    else:
        assert t.evaluation is None and d.num_files_eval == 0
    # DLIO's PyTorch loader (its events name it; no config in the trace): its sampler, whole batches
    dlio = trace.name.startswith("dlio_")
    assert (r.sample_order, r.drop_last) == (("dlio", True) if dlio else ("pytorch", False))
    for field in (
        "reader.batch_size",
        "reader.read_threads",
        "train.epochs",
        "train.computation_time",
        "dataset.num_samples_per_file",
    ):
        assert m.provenance.fields[field].confidence == "measured", field


@pytest.mark.parametrize("trace", DLIO, ids=lambda p: p.name)
def test_analyze_au_matches_dlio(trace: Path) -> None:
    """AU by DLIO's formula from the trace: with DLIO's configured compute time per step (DLIO
    counts that, not the time its sleep took) it is DLIO's printed AU within a point;
    with the measured compute, within 2 points unless the sleeps overshot (load on the VM)."""
    exp = _expected(trace)
    printed = exp["dlio_metrics"]["Training Accelerator Utilization [AU] (%)"] / 100
    lt = load_trace(trace)
    c = characterize(lt.events, passes=["steps"])
    st = c.view.step_table
    nominal = st.with_columns(
        pl.lit(int(exp["model"]["computation_time"] * 1e6)).alias("compute_us")
    )
    assert au_dlio(nominal) == pytest.approx(printed, abs=0.01)
    overshoot = float(st["compute_us"].mean()) / (exp["model"]["computation_time"] * 1e6) - 1
    if overshoot < 0.02:
        assert c["steps"]["au_dlio"] == pytest.approx(printed, abs=0.02)


#: Darshan's fractions per open (analyze) of DLIO's readers on the corpus: PIL reads each JPEG
#: from its start in two reads; numpy's zip reader reads the NPZ header, seeks to the end of
#: the file for its directory, then back to the member; DLIO's HDF5 reader preads samples.
DLIO_ACCESS = {
    "dlio_jpeg_ckpt": (1.0, 1.0),
    "dlio_npz_starved": (0.9211, 0.8947),
    "dlio_npz_2ranks": (0.625, 0.5),
    "dlio_ib_multi": (1.0, 0.25),
    "dlio_npz_eval": (0.625, 0.5),
    "dlio_h5_multi": (0.6667, 0.3333),
    # each np.load: the header's 4 KiB buffer, then the array from 0 (recovered from numpy's
    # seeks: analyze/trace/hidden.py)
    "dlio_npy_small": (0.5, 0.5),
}


#: DLIO runs whose reader maps its files (mmap_indexed_binary): no read calls to check.
MAPPED = {"dlio_ib_mmap"}


@pytest.mark.parametrize("trace", [d for d in DLIO if d.name not in MAPPED], ids=lambda p: p.name)
def test_dlio_reads_have_offsets_and_an_access_pattern(trace: Path) -> None:
    """DLIO 2.0.0's traces (pydftracer 1.x: files by ``fname``, the rank as pid, reader workers as
    threads) get every dataset read's offset: read ends stay within the file size that the
    worker's own lseek(SEEK_END) reported (a reader that only seeks to records, as the
    indexed-binary one does: within the records' bytes), and analyze and distill give the
    access pattern."""
    lt = load_trace(trace)
    c = characterize(lt.events, passes=["access"])
    dataset = c.view.dataset_files
    io = lt.events.filter(pl.col("file").is_in(dataset) & (pl.col("cat") == "POSIX"))
    reads = io.filter(pl.col("name").is_in(["read", "pread", "pread64"]) & (pl.col("size") > 0))
    assert reads.height and reads["offset"].null_count() == 0
    exp = _expected(trace)["model"]
    records = exp["num_samples_per_file"] * exp["record_length"]
    ends = (
        io.filter((pl.col("name") == "lseek64") & (pl.col("ret") > 0))
        .group_by("file")
        .agg(pl.max_horizontal(pl.col("ret").max(), pl.lit(records)).alias("size"))
    )
    if ends.height:  # every read lies inside its file
        within = reads.join(ends, on="file").select(
            (pl.col("offset") + pl.col("size")) <= pl.col("size_right")
        )
        assert within.to_series().all()
    a = c["access"]
    assert (a["sequential"], a["consecutive"]) == DLIO_ACCESS[trace.name]
    pattern = distill(lt.events, source=str(trace)).reader.access_pattern
    # (np.load reads the array again from the header's end, inside the 4 KiB its file object
    # had read: each sample's second read starts behind the first's end, none is sequential)
    low = 0 if trace.name == "dlio_npy_small" else 1e-9
    assert pattern.sequential is not None and low <= pattern.sequential <= 1


def test_io_bound_dlio_run_fires_data_wait_and_worker_findings(cli) -> None:
    out = json.loads(cli("analyze", str(TRACES / "dlio_npz_starved"), "--json", check=True).stdout)
    ids = {f["id"] for f in out["findings"]}
    assert {"data-wait", "too-few-workers"} <= ids
    assert out["characterization"]["steps"]["au"] < 0.5


@pytest.mark.parametrize("trace", FOREIGN, ids=lambda p: p.name)
def test_every_command_reads_foreign_traces(trace: Path, cli, tmp_path: Path) -> None:
    text = cli("analyze", str(trace), check=True).stdout
    assert "no data-loader events" not in text and "AU " in text
    assert "epoch(s)" in text and " 0 batch fetch" not in text
    model = tmp_path / "model.yaml"
    cli("distill", str(trace), "-o", str(model), "-q", check=True)
    cmp = json.loads(cli("compare", str(trace), str(trace), "--json", check=True).stdout)
    for side in ("a", "b"):
        timing = cmp["timing"][side]
        assert timing["au"] is not None and timing["epoch_times_s"] and timing["wait_s"] is not None
    out = tmp_path / "t.json.gz"
    cli("export", str(trace), "-o", str(out), check=True)
    assert out.stat().st_size > 0


def test_dlio_lines_are_kept_as_printed() -> None:
    for trace in DLIO:
        exp = _expected(trace)
        assert any(
            line.startswith("Training Accelerator Utilization [AU] (%)")
            for line in exp["dlio_lines"]
        )
        assert exp["model"]["ranks"] == (2 if trace.name == "dlio_npz_2ranks" else 1)
