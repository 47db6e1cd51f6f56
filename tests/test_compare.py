"""``dlreplay compare`` and ``analyze --verify`` on real captures and real replays."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .conftest import TRACES


def test_compare_trace_with_itself_is_one(cli) -> None:
    proc = cli("compare", str(TRACES / "npz_fork"), str(TRACES / "npz_fork"), "--json", check=True)
    out = json.loads(proc.stdout)
    assert out["schema"] == "dlreplay.comparison"
    assert out["similarity"] == pytest.approx(1.0, abs=1e-9)
    assert out["ks"] == {"read_sizes": 0.0, "batch_gaps": 0.0}
    assert out["features"]["files"]["a"] == out["features"]["files"]["b"] > 0


def test_min_similarity_sets_exit_code(cli, tmp_path: Path) -> None:
    a, b = str(TRACES / "npz_fork"), str(TRACES / "jpeg_small")
    sim = json.loads(cli("compare", a, b, "--json", check=True).stdout)["similarity"]
    assert 0 < sim < 0.99
    proc = cli("compare", a, b, "--min-similarity", "0.99")
    assert proc.returncode == 1 and "below --min-similarity" in proc.stderr
    assert cli("compare", a, b, "--min-similarity", f"{sim - 0.01:.4f}").returncode == 0
    report = tmp_path / "cmp.md"
    proc = cli("compare", a, b, "--report", str(report), check=True)
    assert "similarity (cosine" in proc.stdout and report.is_file()
    assert sorted(p.name for p in (tmp_path / "cmp.figures").iterdir()) == ["batch_gaps.png", "epochs.png",
                                                                             "read_sizes.png"]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["npz_fork", "h5_shuffle", "jpeg_small"])
def test_real_job_vs_replay_of_its_model(name: str, cli, tmp_path: Path) -> None:
    """The DLIO paper's check: a replay of the distilled model looks like the real job (>= 0.9)."""
    model = tmp_path / "model.yaml"
    cli("distill", str(TRACES / name), "-o", str(model), "-q", check=True)
    replay = tmp_path / "replay"
    cli("replay", str(model), "--data-dir", str(tmp_path / "data"), "--out", str(replay), check=True)
    out = json.loads(cli("compare", str(TRACES / name), str(replay), "--json", "--min-similarity", "0.9",
                         check=True).stdout)
    print(f"{name}: similarity {out['similarity']:.4f}, KS read sizes {out['ks']['read_sizes']}, "
          f"KS batch gaps {out['ks']['batch_gaps']}")
    assert out["similarity"] >= 0.9
    assert out["features"]["files"]["a"] == out["features"]["files"]["b"]
    assert out["timing"]["b"]["au"] is not None and out["timing"]["b"]["source"] == "trace"


@pytest.mark.slow
def test_verify_predicts_more_workers_help(cli, tmp_path: Path) -> None:
    """--verify on the 1-worker NPZ run: the replay with more workers predicts a higher AU.

    Replays sleep for compute, so a busy machine (CPU steal) blurs small differences:
    up to three attempts, each a full verification.
    """
    seen = []
    for attempt in range(3):
        work = tmp_path / f"verify-{attempt}"
        proc = cli("analyze", str(TRACES / "npz_starved"), "--verify", "--verify-dir", str(work), "--json",
                   check=True)
        runs = {r["label"]: r for r in json.loads(proc.stdout)["verify"]["runs"]}
        base, more = runs["baseline"], runs["too-few-workers"]
        assert more["overrides"][0].startswith("reader.read_threads=")
        assert all(Path(r["out"]).is_relative_to(work) and r["complete"] for r in runs.values())
        seen.append((base["au"], more["au"]))
        print(f"verify attempt {attempt + 1}: baseline AU {base['au']}, {more['overrides']} AU {more['au']}")
        if more["au"] > base["au"] and more["samples_per_s"] > base["samples_per_s"]:
            return
    pytest.fail(f"more workers never predicted a higher AU: {seen}")
