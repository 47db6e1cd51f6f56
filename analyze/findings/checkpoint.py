"""Finding rules about checkpoints: training blocked in saves, small writes, no fsync."""

from __future__ import annotations

from dlreplay.units import human_bytes

from ..passes import Characterization
from .base import Finding, Thresholds


def rule_checkpoint(c: Characterization, t: Thresholds) -> list[Finding]:
    k = c["checkpoints"]
    out: list[Finding] = []
    if not k["saves"]:
        return out
    share = k.get("share_of_training") or 0.0
    if share >= t.checkpoint_share:
        out.append(
            Finding(
                id="checkpoint-stall",
                severity="high" if share >= t.checkpoint_share_high else "medium",
                title=f"Training blocked in checkpoints: {share:.0%} of training time ({k['saves']} saves, "
                f"{human_bytes(k['bytes'])})",
                evidence={
                    "saves": k["saves"],
                    "bytes": k["bytes"],
                    "blocked_s": k["blocked_s"],
                    "share_of_training": share,
                    "training_s": k["training_s"],
                    "save_time_s": k["save_time"],
                    "bandwidth_bps": k["bandwidth_bps"],
                },
                threshold=f"blocked share >= {t.checkpoint_share} (high from {t.checkpoint_share_high})",
                root_cause="torch.save runs in the training loop: the model and optimizer state are serialised and "
                f"written synchronously at {human_bytes(k['bandwidth_bps'] or 0)}/s while the accelerator idles.",
                recommendation="Checkpoint less often, write asynchronously (torch.distributed.checkpoint async_save, "
                "or copy state to host memory and write from a thread), or to faster storage.",
                impact_s=float(k["blocked_s"] or 0.0),
                processes=c.view.consumers[:8],
                whatif=["checkpoint.steps_between_checkpoints=" + str(_double_interval(c))],
            )
        )
    ws = k["write_size"]
    if k["writes_visible"] and ws["median"] is not None and ws["median"] < t.checkpoint_write_bytes:
        out.append(
            Finding(
                id="checkpoint-small-writes",
                severity="low",
                title=f"Checkpoints written in small calls: median {human_bytes(ws['median'])}",
                evidence={"write_calls": k["write_calls"], "write_size": ws},
                threshold=f"median checkpoint write < {t.checkpoint_write_bytes} B",
                root_cause="The serialiser writes through small buffers; each write is a system call.",
                recommendation="Write through a large buffer (open(..., buffering=16<<20)) or serialise to memory "
                "first.",
            )
        )
    if k["fsyncs"] == 0:
        out.append(
            Finding(
                id="checkpoint-no-fsync",
                severity="info",
                title="Checkpoints are not fsync'ed",
                evidence={"saves": k["saves"], "fsyncs": 0},
                threshold="checkpoint saves without fsync/fdatasync",
                root_cause="torch.save returns when the bytes are in the page cache; a node crash can lose the "
                "checkpoint, and the measured save time hides the real cost of reaching storage.",
                recommendation="fsync checkpoint files where durability is expected, and replay with "
                "checkpoint.fsync=true to measure the real cost.",
                whatif=["checkpoint.fsync=true"],
            )
        )
    return out


def _double_interval(c: Characterization) -> int:
    v = c.view
    saves = v.saves.height
    steps = v.steps.height
    return max(2, 2 * max(1, round(steps / saves))) if saves else 2
