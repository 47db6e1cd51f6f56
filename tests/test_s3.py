"""S3 object storage end to end (#46 items 4, 5), against a real S3 server (s3rver, started by
:mod:`tests.s3server` on 127.0.0.1 with its state on disk): ``dlreplay capture`` of
``examples/s3_objects.py`` in two variants (whole-object GETs of 32 KiB npy objects; ranged
GETs of 16 KiB over 96 KiB objects) records each GET; distill writes ``storage: s3`` with the
objects' and the requests' sizes; DLIO export/import keep the section; ``generate`` uploads the
dataset and the replay reads it through boto3 with the same requests; no credential is in any
output."""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dlreplay.analyze import load_trace
from dlreplay.analyze.compare import _served_lines as _compare_served_lines
from dlreplay.analyze.compare import compare_traces
from dlreplay.analyze.distill import distill
from dlreplay.analyze.distill.storage import object_reads
from dlreplay.capture.inject import s3 as s3hook
from dlreplay.dlio import dlio_to_model, model_to_dlio
from dlreplay.model import load_model, model_to_dict, save_model
from dlreplay.replay.metrics import served_summary
from tests.conftest import EXAMPLES, check_no_traceback
from tests.s3server import ACCESS_KEY, SECRET_KEY, S3Server, find_s3rver, s3_server

boto3 = pytest.importorskip("boto3", reason="boto3 (pip install 'dlreplay[s3]')")
if find_s3rver() is None:
    pytest.skip(
        "s3rver not installed (node + npm s3rver; .ci/run installs it)", allow_module_level=True
    )

EXAMPLE = EXAMPLES / "s3_objects.py"
BUCKET = "dlreplay-test-objects"
COMMON = ["--bucket", BUCKET, "--num-objects", "8", "--workers", "1", "--epochs", "2"]
COMMON += ["--batch-size", "4", "--compute-ms", "2"]
#: the whole-object variant reads through s3torchconnector where it is installed (extra s3torch)
WHOLE_CLIENT = "s3torchconnector" if importlib.util.find_spec("s3torchconnector") else "boto3"
CLIENTS = {"whole": WHOLE_CLIENT, "ranged": "boto3"}
#: variant -> (example args, object payload bytes, bytes per GET: None = whole objects)
VARIANTS: dict[str, tuple[list[str], int, int | None]] = {
    "whole": (
        ["--prefix", "whole/", "--sample-bytes", "32768", "--client", WHOLE_CLIENT],
        32768,
        None,
    ),
    "ranged": (
        ["--prefix", "ranged/", "--sample-bytes", "98304", "--range-bytes", "16384"],
        98304,
        16384,
    ),
}
NPY_HEADER = 128  # np.save's header of a 1-D float32 array

FSSPEC_JOB = """
import hashlib, json, sys
import s3fs

bucket, prefix, step, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
fs = s3fs.S3FileSystem(skip_instance_cache=True)
digests = {}
for path in sorted(fs.ls(f"{bucket}/{prefix}")):
    whole = fs.cat_file(path)  # one GET of the object
    with fs.open(path, "rb", cache_type="none") as f:  # ranged GETs of step bytes
        ranged = b"".join(f.read(step) for _ in range(-(-len(whole) // step)))
    assert ranged == whole
    digests[path] = hashlib.sha256(whole).hexdigest()
json.dump(digests, open(out, "w"))
"""


def _plain_client(endpoint: str) -> Any:
    """A boto3 client of the test server, outside any capture."""
    return boto3.session.Session().client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
        region_name="us-east-1",
    )


def _run(args: list[str], env: dict[str, str], **kw: Any) -> subprocess.Popen:
    return subprocess.Popen(
        args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw
    )


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    with s3_server(tmp_path_factory.mktemp("s3") / "state") as s:
        yield s


@pytest.fixture(scope="module")
def env(server: S3Server) -> dict[str, str]:
    return {**os.environ, **server.env()}


@pytest.fixture(scope="module")
def runs(server: S3Server, env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Both datasets uploaded; both variants captured at once. Returns their directory:
    t_<variant> (traces), r_<variant>.json (the jobs' reports)."""
    root = tmp_path_factory.mktemp("s3runs")
    ups = [
        _run([sys.executable, str(EXAMPLE), "--populate", *COMMON, *a], env)
        for a, _, _ in VARIANTS.values()
    ]
    for p in ups:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0, out
    procs = {}
    if importlib.util.find_spec("s3fs") is not None:  # an s3fs job beside them (FSSPEC_JOB)
        (root / "fsspec_job.py").write_text(FSSPEC_JOB)
        job = [sys.executable, str(root / "fsspec_job.py"), BUCKET, "ranged/", "16384"]
        cap = [sys.executable, "-m", "dlreplay", "capture", "--out", str(root / "t_fsspec"), "--"]
        procs["fsspec"] = _run([*cap, *job, str(root / "fsspec.json")], env)
    for name, (args, _, _) in VARIANTS.items():
        job = [
            sys.executable,
            str(EXAMPLE),
            *COMMON,
            *args,
            "--report",
            str(root / f"r_{name}.json"),
        ]
        cap = [sys.executable, "-m", "dlreplay", "capture", "--out", str(root / f"t_{name}"), "--"]
        procs[name] = _run([*cap, *job], env)
    for name, p in procs.items():
        out, _ = p.communicate(timeout=300)
        check_no_traceback(out, what=f"capture {name}")
        assert p.returncode == 0, f"{name}: {out}"
    return root


def _report(root: Path, name: str) -> dict:
    return json.loads((root / f"r_{name}.json").read_text())


@pytest.mark.parametrize("name", list(VARIANTS))
def test_capture_records_each_get(runs: Path, name: str) -> None:
    _, payload, step = VARIANTS[name]
    size = payload + NPY_HEADER
    gets = object_reads(runs / f"t_{name}")
    per_object = 1 if step is None else -(-size // step)
    assert gets.height == 8 * per_object * 2  # objects x GETs each x epochs
    assert set(gets["bucket"]) == {BUCKET}
    assert gets["key"].str.starts_with(f"{name}/").all()
    assert set(gets["client"]) == {CLIENTS[name]}
    if CLIENTS[name] == "boto3":  # s3torchconnector's stream does not say the object's size
        assert set(gets["object_size"]) == {size}
    assert gets["error"].is_null().all()
    report = _report(runs, name)
    assert gets["bytes"].sum() == sum(e["bytes"] for e in report["epochs"])
    if step is None:
        assert gets["length"].is_null().all() and set(gets["offset"]) == {0}
        assert set(gets["bytes"]) == {size}
    else:  # ranges of 16 KiB from 0, the object's tail last
        assert sorted(set(gets["offset"])) == list(range(0, size, step))
        tail = size - (per_object - 1) * step
        assert set(gets["length"]) == {step, tail}
        assert set(gets["bytes"]) == {step, tail}
    manifest = json.loads((runs / f"t_{name}" / "manifest.json").read_text())
    assert not [m for m in manifest.get("hook_misses", []) if m["hook"].startswith("boto3")]


@pytest.mark.parametrize("name", list(VARIANTS))
def test_capture_is_transparent(runs: Path, server: S3Server, name: str) -> None:
    """Each captured job (boto3 ranges; s3torchconnector where installed) got every object's
    bytes as a plain boto3 client outside the capture reads them, each once per epoch; the
    botocore hook returns botocore's result and raises its exceptions unchanged."""
    s3 = _plain_client(server.endpoint)
    listed = s3.list_objects_v2(Bucket=BUCKET, Prefix=f"{name}/")["Contents"]
    direct = {
        hashlib.sha256(s3.get_object(Bucket=BUCKET, Key=o["Key"])["Body"].read()).hexdigest(): 2
        for o in listed
    }
    assert len(direct) == 8 and _report(runs, name)["sample_digests"] == direct
    plain = type(s3)._make_api_call
    wrapped = s3hook.wrap_make_api_call(plain)
    key = "ranged/sample_00000.npy"
    params = {"Bucket": BUCKET, "Key": key, "Range": "bytes=5-104"}
    assert (
        wrapped(s3, "GetObject", params)["Body"].read()
        == plain(s3, "GetObject", params)["Body"].read()
    )
    for call in (plain, wrapped):
        with pytest.raises(s3.exceptions.NoSuchKey):
            call(s3, "GetObject", {"Bucket": BUCKET, "Key": "missing"})
    assert s3hook.parse_range("bytes=-10") == (None, 10)
    assert s3hook.parse_range("bytes=7-") == (7, None)


@pytest.fixture(scope="module")
def models(runs: Path) -> dict[str, Any]:
    out = {}
    for name in VARIANTS:
        trace = runs / f"t_{name}"
        lt = load_trace(trace)
        out[name] = distill(lt.events, manifest=lt.manifest, source=str(trace))
        save_model(out[name], runs / f"m_{name}.yaml")
    return out


@pytest.mark.parametrize("name", list(VARIANTS))
def test_distill_storage_s3(models: dict[str, Any], name: str) -> None:
    _, payload, step = VARIANTS[name]
    size = payload + NPY_HEADER
    m = models[name]
    st = m.storage
    assert (st.storage_type, st.storage_root, st.prefix, st.client) == (
        "s3",
        BUCKET,
        f"{name}/",
        CLIENTS[name],
    )
    assert st.object_bytes == size
    assert st.request_bytes == (size if step is None else step)
    assert st.ranged is (step is not None)
    assert (m.dataset.num_files, m.dataset.format, m.dataset.num_samples_per_file) == (8, "npy", 1)
    assert m.dataset.record_length.mean == size
    assert m.dataset.data_folder == name  # DLIO's data_folder under storage_root
    assert m.reader.transfer_size.quantiles["p50"] == (size if step is None else step)
    assert m.reader.read_threads == 1 and m.train.epochs == 2


def test_dlio_keeps_storage(models: dict[str, Any]) -> None:
    cfg, _ = model_to_dlio(models["ranged"])
    assert cfg["storage"]["storage_type"] == "s3" and cfg["storage"]["storage_root"] == BUCKET
    back = dlio_to_model(cfg)
    assert back.storage == models["ranged"].storage
    # credentials in a DLIO config stay there: never read into the model
    cfg["storage"]["storage_options"].update(secret_access_key="sekrit-1", endpoint_url="http://x")
    kept = dlio_to_model(cfg)
    assert kept.storage == models["ranged"].storage
    assert "sekrit-1" not in json.dumps(model_to_dict(kept), default=str)
    assert dlio_to_model({k: v for k, v in cfg.items() if k != "storage"}).storage is None


@pytest.fixture(scope="module")
def replays(runs: Path, models: dict[str, Any], env: dict[str, str]) -> dict[str, Path]:
    """Both models replayed at once, each into a bucket of its own (generate uploads first)."""
    procs = {}
    for name in VARIANTS:
        cmd = [sys.executable, "-m", "dlreplay", "replay", str(runs / f"m_{name}.yaml")]
        cmd += ["--data-dir", str(runs / f"gen_{name}"), "-o", str(runs / f"replay_{name}")]
        cmd += ["--set", f"storage.storage_root=replayed-{name}", "--loader", "builtin"]
        # whole: --cold (nothing of an object store to drop: said so); ranged: --io posix (the
        # storage-level reads, the benchmark's)
        cmd += ["--cold"] if name == "whole" else ["--io", "posix"]
        procs[name] = _run(cmd, env)
    for name, p in procs.items():
        out, _ = p.communicate(timeout=300)
        (runs / f"replay_{name}.out").write_text(out)
        check_no_traceback(out, what=f"replay {name}")
        assert p.returncode in (0, 1), out  # 1: the AU threshold failed
    return {name: runs / f"replay_{name}" for name in VARIANTS}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_generate_uploads_and_replay_reads_through_s3(
    runs: Path, replays: dict[str, Path], env: dict[str, str], name: str
) -> None:
    """Each model replayed into another bucket: generate uploads the 8 objects with their layout,
    the replay GETs them through the job's client with the job's request size (16 KiB ranges, or
    whole objects); the bytes match the capture's within 2 %."""
    _, _, step = VARIANTS[name]
    s3 = _plain_client(env["AWS_ENDPOINT_URL"])
    listed = s3.list_objects_v2(Bucket=f"replayed-{name}", Prefix=f"{name}/")["Contents"]
    assert len(listed) == 8
    gets = object_reads(replays[name])
    assert set(gets["bucket"]) == {f"replayed-{name}"}
    assert set(gets["client"]) == {CLIENTS[name]}
    if step is None:
        assert gets["length"].is_null().all() and gets.height == 8 * 2
    else:
        assert gets["length"].drop_nulls().max() == step
    real = object_reads(runs / f"t_{name}")["bytes"].sum()
    assert abs(gets["bytes"].sum() - real) <= 0.02 * real
    cmp = compare_traces(runs / f"t_{name}", replays[name])
    assert cmp.features_a["bytes_read"] == real
    assert abs((cmp.features_b["bytes_read"] or 0) - real) <= 0.02 * real
    print(
        f"S3 job ({name}, {CLIENTS[name]}) capture->distill->replay: similarity "
        f"{cmp.similarity:.4f}, bytes {real} -> {cmp.features_b['bytes_read']}"
    )


@pytest.mark.parametrize("name", list(VARIANTS))
def test_s3_replay_served_by_the_object_store(
    runs: Path, replays: dict[str, Path], env: dict[str, str], name: str
) -> None:
    """An S3 replay's "served by the storage" is what the object store returned to its GETs, not
    the block layer's reads (none: no page cache is in the path): the GETs, whole or ranged,
    returned each object's size as the server lists it, once per epoch. No page-cache line in metrics.json, the summary or
    compare; --cold says it has nothing to drop."""
    m = json.loads((replays[name] / "metrics.json").read_text())
    o, epochs = m["overall"], m["epochs"]
    assert o["served_from"] == "object_store" and o["cache_served_percent"] is None
    assert o["device_read_bytes"] is None and o["device"] is None
    assert [e["served_from"] for e in epochs] == ["object_store"] * 2
    assert sum(e["served_bytes"] for e in epochs) == o["served_bytes"]
    s3 = _plain_client(env["AWS_ENDPOINT_URL"])
    sizes = [int(x["Size"]) for x in s3.list_objects_v2(Bucket=f"replayed-{name}")["Contents"]]
    for e in epochs:  # every object read whole once per epoch (whole, or in ranges of step)
        assert e["served_bytes"] == sum(sizes) == e["bytes_asked"]
    assert o["served_bytes"] == object_reads(replays[name])["bytes"].sum()
    out = (runs / f"replay_{name}.out").read_text()
    assert "came from the page cache" not in out and "cache %" not in out
    assert "served by S3" in out
    assert not any("came from the page cache" in n for n in m["served_notes"])
    assert "from page cache" not in "\n".join(_compare_served_lines(None, served_summary(m)))
    storage = json.loads((replays[name] / "provenance.json").read_text())["storage"]
    assert storage["objects"] == f"s3://replayed-{name}/{name}/"
    cold = epochs[0].get("cold")
    if name == "whole":
        assert cold["method"] == "none" and "S3" in cold["note"] and cold["note"] in out
    else:
        assert cold is None


def test_credentials_never_in_outputs(
    runs: Path, models: dict[str, Any], replays: dict[str, Path]
) -> None:
    """No file a capture, distill, export or replay wrote holds the access key or the secret."""
    save = runs / "dlio.yaml"
    save.write_text(json.dumps(model_to_dlio(models["ranged"])[0]))
    checked = 0
    for f in runs.rglob("*"):
        if not f.is_file():
            continue
        data = gzip.open(f).read() if f.name.endswith(".gz") else f.read_bytes()
        assert SECRET_KEY.encode() not in data and ACCESS_KEY.encode() not in data, f
        checked += 1
    assert checked > 10
    assert load_model(runs / "m_whole.yaml").storage.storage_root == BUCKET


def test_capture_records_s3fs_gets(runs: Path, server: S3Server) -> None:
    """Every GET s3fs makes (aiobotocore's async client, in fsspec's I/O thread) is an
    S3/GetObject event with its range and the bytes answered (a job reading the ranged variant's
    8 objects whole, then in 16 KiB ranges through a file without a cache, captured beside the
    others); the job got the objects' bytes."""
    pytest.importorskip("s3fs", reason="s3fs (pip install 'dlreplay[s3fs]')")
    fsspec_capture = runs / "t_fsspec"
    _, payload, step = VARIANTS["ranged"]
    size = payload + NPY_HEADER
    gets = object_reads(fsspec_capture)
    per_object = -(-size // step)
    assert set(gets["client"]) == {"s3fs"} and set(gets["bucket"]) == {BUCKET}
    assert gets["error"].is_null().all()
    assert gets.height == 8 * (1 + per_object)
    whole = gets.filter(gets["length"].is_null())
    assert whole.height == 8 and set(whole["bytes"]) == {size}
    ranged = gets.filter(gets["length"].is_not_null())
    assert sorted(set(ranged["offset"])) == list(range(0, size, step))
    assert set(ranged["bytes"]) == {step, size - (per_object - 1) * step}
    assert gets["bytes"].sum() == 2 * 8 * size
    s3 = _plain_client(server.endpoint)
    digests = json.loads((runs / "fsspec.json").read_text())
    for path, digest in digests.items():
        key = path.split("/", 1)[1]
        body = s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()
        assert hashlib.sha256(body).hexdigest() == digest
    assert len(digests) == 8


@pytest.mark.parametrize("ranged", [True, False])
def test_replay_reads_through_s3fs(
    runs: Path, server: S3Server, monkeypatch: pytest.MonkeyPatch, ranged: bool
) -> None:
    """The replay's reader with ``storage.client: s3fs`` GETs through s3fs (ranges of the
    request size, or whole objects): the objects' bytes, and it counts what the GETs returned
    (its served bytes)."""
    pytest.importorskip("s3fs", reason="s3fs (pip install 'dlreplay[s3fs]')")
    from dlreplay.replay.s3 import S3Reader, S3Target

    for k, v in server.env().items():
        monkeypatch.setenv(k, v)
    _, payload, _ = VARIANTS["ranged"]
    size = payload + NPY_HEADER
    target = S3Target(BUCKET, "ranged/", 10000, "s3fs", ranged)
    reader = S3Reader(target, str(runs), {"sample_00003.npy": size}, 1)
    assert reader.library == "s3fs"
    try:
        rec = (100, size - 100) if ranged else None  # a record of the object, or the object
        nbytes, data = reader.read_decoded(str(runs / "sample_00003.npy"), 0, rec)
    finally:
        reader.close()
    s3 = boto3.session.Session().client("s3")
    body = s3.get_object(Bucket=BUCKET, Key="ranged/sample_00003.npy")["Body"].read()
    if ranged:  # ceil((size - 100) / 10000) GETs of the range: the bytes asked, returned
        assert data.tobytes() == body[100:] and nbytes == reader.returned() == size - 100
    else:  # one GET per sample: the whole object
        assert data.tobytes() == body and nbytes == reader.returned() == size


def test_aiobotocore_hook_is_transparent(runs: Path, server: S3Server) -> None:
    """The s3fs hook (aiobotocore's async ``_make_api_call`` wrapped) awaits the original once:
    the same bytes for a ranged GET, and NoSuchKey raised unchanged."""
    import asyncio

    aiosession = pytest.importorskip("aiobotocore.session", reason="s3fs (dlreplay[s3fs])")
    from aiobotocore.client import AioBaseClient

    plain = AioBaseClient._make_api_call
    wrapped = s3hook.wrap_aio_make_api_call(plain)
    params = {"Bucket": BUCKET, "Key": "ranged/sample_00001.npy", "Range": "bytes=5-104"}

    async def calls() -> tuple[list[bytes], list[str]]:
        kw = {"aws_access_key_id": ACCESS_KEY, "aws_secret_access_key": SECRET_KEY}
        async with aiosession.get_session().create_client(
            "s3", endpoint_url=server.endpoint, region_name="us-east-1", **kw
        ) as s3:
            bodies, errors = [], []
            for call in (wrapped, plain):
                resp = await call(s3, "GetObject", dict(params))
                async with resp["Body"] as body:
                    bodies.append(await body.read())
                try:
                    await call(s3, "GetObject", {"Bucket": BUCKET, "Key": "missing"})
                except s3.exceptions.NoSuchKey as exc:
                    errors.append(type(exc).__name__)
            return bodies, errors

    bodies, errors = asyncio.run(calls())
    assert bodies[0] == bodies[1] and len(bodies[0]) == 100
    assert errors == ["NoSuchKey", "NoSuchKey"]
