"""A real S3 server for the tests: ``s3rver`` (Node.js, npm package ``s3rver``), started on
127.0.0.1 on a free port with its state (buckets, objects, metadata) in a directory on disk.

Why s3rver: Ceph's ``radosgw`` from Debian 12 (16.2.15, Pacific) has no standalone ``dbstore``
back end (that arrived in Quincy, 17.x): started without monitors it fails with "Couldn't init
storage provider (RADOS)". s3rver implements the S3 REST API that boto3 speaks (buckets,
PUT/GET/HEAD objects, ``Range`` GETs with ``206 Partial Content``, ListObjectsV2, multipart)
over plain files, with one account (access key ``S3RVER``, secret ``S3RVER``), and starts in
about a second. moto's server mode was not
needed.

Where it is found: ``$DLREPLAY_S3RVER`` (the ``s3rver.js`` script or an npm prefix), else the npm
prefix ``~/.cache/dlreplay/s3rver`` (where ``.ci/run`` installs it), else ``s3rver`` on PATH.
Tests skip with a reason when neither node nor s3rver is there.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

#: s3rver's one account.
ACCESS_KEY = "S3RVER"
SECRET_KEY = "S3RVER"
REGION = "us-east-1"
DEFAULT_PREFIX = Path.home() / ".cache" / "dlreplay" / "s3rver"


def find_s3rver() -> list[str] | None:
    """The command that starts s3rver (``node .../s3rver.js`` or ``s3rver``), or None."""
    node = shutil.which("node")
    given = os.environ.get("DLREPLAY_S3RVER")
    candidates = []
    if given:
        p = Path(given)
        candidates += [p, p / "node_modules" / "s3rver" / "bin" / "s3rver.js"]
    candidates.append(DEFAULT_PREFIX / "node_modules" / "s3rver" / "bin" / "s3rver.js")
    for c in candidates:
        if node and c.is_file():
            return [node, str(c)]
    on_path = shutil.which("s3rver")
    return [on_path] if on_path and node else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class S3Server:
    """A running server: its endpoint and the environment a client needs to reach it."""

    endpoint: str
    directory: Path

    def env(self) -> dict[str, str]:
        """The usual AWS variables (endpoint, keys, region) for a client process."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_DEFAULT_REGION": REGION,
            # never read the tester's own ~/.aws files
            "AWS_CONFIG_FILE": os.devnull,
            "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        }


def _answers(endpoint: str) -> bool:
    try:
        with urllib.request.urlopen(endpoint + "/", timeout=1):
            return True
    except urllib.error.HTTPError:  # 403 without a signature: it answers
        return True
    except OSError:
        return False


@contextlib.contextmanager
def s3_server(directory: Path, timeout: float = 30.0) -> Iterator[S3Server]:
    """Start s3rver on 127.0.0.1 with its state under *directory*; wait until it answers
    HTTP; stop it (SIGTERM, then SIGKILL) on exit. Raises RuntimeError when it cannot start."""
    cmd = find_s3rver()
    if cmd is None:
        raise RuntimeError("s3rver not found (node and npm package s3rver; see tests/s3server.py)")
    directory.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log = open(directory.parent / f"s3rver-{port}.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [*cmd, "-d", str(directory), "-a", "127.0.0.1", "-p", str(port), "--silent"],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while not _answers(endpoint):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"s3rver did not start on {endpoint} (exit {proc.poll()})")
            time.sleep(0.05)
        yield S3Server(endpoint, directory)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
