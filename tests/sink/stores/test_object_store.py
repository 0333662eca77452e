"""The output filesystem on real object stores (SeaweedFS, moto's S3 server, Azurite): the operations pgpoll
builds on, the conditional create every racer but one loses, the compare-and-swap, and reads through Arrow."""

from __future__ import annotations

import pickle
import threading

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pgpoll.sink.stores.config import StoreLocation
from pgpoll.sink.stores.filesystem import open_output
from pgpoll.sink.stores.object_store import ObjectStoreOutputFs
from pgpoll.testing.object_stores import SECRET_KEY, StoreBucket


def test_small_files_list_and_delete_like_directories(store_bucket: StoreBucket) -> None:
    fs = open_output(store_bucket.url)
    assert isinstance(fs, ObjectStoreOutputFs) and fs.fenced and fs.direct_writes and not fs.atomic_dir_rename
    record = fs.path("_pgpoll", "commits", "seq-0000000000000001.json")
    assert not fs.exists(fs.path("_pgpoll")) and fs.list(fs.path("_pgpoll")) == []
    fs.write_text(record, '{"seq": 1}')
    fs.write_text(fs.path("_pgpoll", "lease.json"), "{}")
    assert fs.exists(record) and fs.exists(fs.path("_pgpoll", "commits")) and not fs.exists(fs.path("_pgpoll", "comm"))
    assert sorted(fs.list(fs.path("_pgpoll"))) == [("commits", True, 0), ("lease.json", False, 2)]
    assert fs.list(fs.path("_pgpoll", "commits")) == [("seq-0000000000000001.json", False, 10)]
    assert fs.read_text(record) == '{"seq": 1}'
    fs.delete(fs.path("_pgpoll", "commits"))
    assert not fs.exists(record) and fs.exists(fs.path("_pgpoll", "lease.json"))
    fs.delete(fs.path("_pgpoll", "nothing-here"))  # absent: not an error


def test_create_exclusive_creates_once_and_a_retry_of_the_winner_still_wins(store_bucket: StoreBucket) -> None:
    fs = open_output(store_bucket.url)
    path = fs.path("_pgpoll", "commits", "seq-0000000000000001.json")
    assert fs.create_exclusive(path, '{"run": "a"}') is True
    assert fs.create_exclusive(path, '{"run": "b"}') is False
    assert fs.read_text(path) == '{"run": "a"}'
    # a request retried after its response was lost finds its own object: the same bytes mean it won
    assert fs.create_exclusive(path, '{"run": "a"}') is True


def test_many_writers_racing_for_one_key_leave_exactly_one_winner(store_bucket: StoreBucket) -> None:
    fs = open_output(store_bucket.url)
    rounds, writers = 8, 4
    for n in range(rounds):
        path = fs.path("race", f"seq-{n}.json")
        won: list[int] = []
        start = threading.Barrier(writers)

        def race(i: int, path: str = path, won: list[int] = won, start: threading.Barrier = start) -> None:
            start.wait()
            if fs.create_exclusive(path, f'{{"writer": {i}}}'):
                won.append(i)

        threads = [threading.Thread(target=race, args=(i,)) for i in range(writers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(won) == 1, f"round {n}: winners {won}"
        assert fs.read_text(path) == f'{{"writer": {won[0]}}}'


def test_swap_replaces_only_what_the_caller_read(store_bucket: StoreBucket) -> None:
    fs = open_output(store_bucket.url)
    path = fs.path("_pgpoll", "lease.json")
    assert fs.read_tagged(path) is None
    fs.write_text(path, '{"run": "a"}')
    tagged = fs.read_tagged(path)
    assert tagged is not None and tagged[0] == '{"run": "a"}'
    assert fs.swap(path, '{"run": "b"}', tagged[1]) is True
    assert fs.swap(path, '{"run": "c"}', tagged[1]) is False  # stale: b replaced what a and c read
    assert fs.read_text(path) == '{"run": "b"}'
    newer = fs.read_tagged(path)
    assert newer is not None and newer[1] != tagged[1]


def test_swap_race_has_one_winner(store_bucket: StoreBucket) -> None:
    fs = open_output(store_bucket.url)
    path = fs.path("_pgpoll", "lease.json")
    fs.write_text(path, '{"run": "old"}')
    tagged = fs.read_tagged(path)
    assert tagged is not None
    won: list[int] = []
    start = threading.Barrier(4)

    def race(i: int) -> None:
        start.wait()
        if fs.swap(path, f'{{"run": {i}}}', tagged[1]):
            won.append(i)

    threads = [threading.Thread(target=race, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1 and fs.read_text(path) == f'{{"run": {won[0]}}}'


def test_parquet_through_arrow_and_uploads(store_bucket: StoreBucket, tmp_path: pytest.TempPathFactory) -> None:
    fs = open_output(store_bucket.url)
    table = pa.table({"id": list(range(50_000)), "name": [f"n{i}" for i in range(50_000)]})
    target = fs.path("changes", "lsn_range=0-1", "part-00000.parquet")
    pq.write_table(table, fs.arrow_path(target), filesystem=fs.arrow())
    assert pq.read_table(fs.arrow_path(target), filesystem=fs.arrow()).equals(table)
    local = f"{tmp_path}/local.parquet"
    pq.write_table(table, local)
    uploaded = fs.path("changes", "lsn_range=0-1", "part-00001.parquet")
    size = fs.put_file(local, uploaded)
    assert ("part-00001.parquet", False, size) in fs.list(fs.path("changes", "lsn_range=0-1"))
    assert pq.read_table(fs.arrow_path(uploaded), filesystem=fs.arrow()).equals(table)


def test_a_location_pickles_with_its_settings_and_shows_no_secret(s3_bucket: StoreBucket) -> None:
    fs = open_output(s3_bucket.url.replace("s3://", "s3a://"))
    assert fs.root == s3_bucket.url  # s3a:// is the same store
    fs.write_text(fs.path("a.txt"), "x")
    shipped = pickle.loads(pickle.dumps(fs))  # what a Spark task gets: it reaches the store with the driver's settings
    assert isinstance(shipped, ObjectStoreOutputFs) and shipped.read_text(shipped.path("a.txt")) == "x"
    assert SECRET_KEY not in repr(fs.location) and SECRET_KEY not in repr(fs) and "***" in repr(fs.location)


def test_abfss_urls_name_the_container_and_account() -> None:
    location = StoreLocation.parse("abfss://lake@myaccount.dfs.core.windows.net/pg/orders", {})
    assert (location.kind, location.bucket, location.prefix) == ("az", "lake", "pg/orders")
    assert location.setting("AZURE_STORAGE_ACCOUNT_NAME") == "myaccount"
    assert location.url("_pgpoll/lease.json") == "az://lake/pg/orders/_pgpoll/lease.json"
