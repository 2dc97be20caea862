"""The on-disk cache of parsed sentence pools (:mod:`engine.data.text_cache`): a pool read back
is the pool built, and any change to its inputs builds it again."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from engine.data import stdlib_text, text_cache
from engine.data.text_cache import CACHE_ENV, cache_dir, cached_pool


class Counting:
    """A build that records its calls and returns ``pool``."""

    def __init__(self, pool):
        self.pool, self.calls = pool, 0

    def __call__(self):
        self.calls += 1
        return iter(self.pool)  # a generator, as the real builds give


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def sources(tmp_path) -> list[Path]:
    files = [tmp_path / "a.py", tmp_path / "b.py"]
    for f in files:
        f.write_text('"""Doc."""\n')
    return files


def test_a_pool_is_built_once_and_read_back_equal(cache, sources):
    code = sources[:1]
    build = Counting([("json", "One sentence."), ("os", "Another one here.")])
    first = cached_pool("t", {"n": 1}, sources, code, build)
    again = cached_pool("t", {"n": 1}, sources, code, build)
    assert build.calls == 1
    assert first == again == (("json", "One sentence."), ("os", "Another one here."))
    assert isinstance(again[0], tuple)
    (entry,) = cache.glob("t-*.json")
    assert json.loads(entry.read_text())["name"] == "t"
    strings = Counting(["a", "b"])  # entries that are plain strings stay strings
    assert cached_pool("s", {}, sources, code, strings) == ("a", "b")
    assert cached_pool("s", {}, sources, code, strings) == ("a", "b") and strings.calls == 1


def test_a_change_to_a_file_the_code_or_the_key_builds_again(cache, sources):
    build = Counting(["x"])
    code = [sources[0]]

    def call(key=None, files=sources):
        cached_pool("t", key or {"n": 1}, files, code, build)

    call()
    stat = sources[1].stat()
    os.utime(sources[1], ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # touched
    call()
    sources[1].write_text('"""Doc, longer."""\n')  # edited
    call()
    call(key={"n": 2})  # other parameters
    call(files=sources[:1])  # another file list
    code[0].write_text('"""Other code."""\n')  # the code that cuts them
    call()
    assert build.calls == 6
    call()
    assert build.calls == 6  # and each of those is now kept


def test_off_builds_every_time_and_writes_nothing(tmp_path, monkeypatch, sources):
    monkeypatch.setenv(CACHE_ENV, "off")
    assert cache_dir() is None
    build = Counting(["x"])
    for _ in range(2):
        assert cached_pool("t", {}, sources, [], build) == ("x",)
    assert build.calls == 2


def test_the_default_directory_follows_xdg(tmp_path, monkeypatch):
    monkeypatch.delenv(CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "comera" / "text"


def test_a_damaged_entry_is_rebuilt_and_a_read_only_cache_is_passed_over(
    cache, sources, monkeypatch
):
    build = Counting(["x", "y"])
    cached_pool("t", {}, sources, [], build)
    (entry,) = cache.glob("t-*.json")
    entry.write_text('{"pool": [')  # cut short
    assert cached_pool("t", {}, sources, [], build) == ("x", "y") and build.calls == 2
    assert json.loads(entry.read_text())["pool"] == ["x", "y"]  # rewritten whole
    blocked = cache / "blocked"
    blocked.write_text("a file where the directory should be")
    monkeypatch.setenv(CACHE_ENV, str(blocked / "cache"))
    assert cached_pool("t", {}, sources, [], build) == ("x", "y") and build.calls == 3
    assert not list(cache.glob(".*.tmp"))


def test_the_stdlib_pools_are_the_uncached_pools(cache, monkeypatch):
    """The real callers: a package's docstring sentences and the comments of a few standard
    modules, built cold and read warm, against the same functions with the cache off."""
    package = stdlib_text.package_sentences.__wrapped__
    comments = stdlib_text._comment_sentences.__wrapped__
    cold = (package(("json",)), comments(("json",), (), 6, 40))
    assert list(cache.glob("package-docstrings-*.json")) and list(cache.glob("comments-*.json"))
    warm = (package(("json",)), comments(("json",), (), 6, 40))
    monkeypatch.setenv(CACHE_ENV, "off")
    plain = (package(("json",)), comments(("json",), (), 6, 40))
    assert cold == warm == plain
    assert all(len(p) > 5 for p in plain)


def test_the_cache_keeps_the_pools_used_last(cache, sources, monkeypatch):
    """Past ``MAX_ENTRIES`` pools a write drops those used longest ago; a read counts as use."""
    monkeypatch.setattr(text_cache, "MAX_ENTRIES", 3)
    builds = {n: Counting([f"pool {n}"]) for n in range(5)}

    def use(n: int, at: int) -> None:
        assert cached_pool("t", {"n": n}, sources, [], builds[n]) == (f"pool {n}",)
        for entry in cache.glob("t-*.json"):  # the clock: the one just used is at ``at``
            if json.loads(entry.read_text())["pool"] == [f"pool {n}"]:
                os.utime(entry, ns=(at * 10**9, at * 10**9))

    (cache / "notes.json").parent.mkdir(parents=True, exist_ok=True)
    (cache / "notes.json").write_text("{}")  # not a pool: never dropped
    os.utime(cache / "notes.json", ns=(0, 0))
    for n in range(3):
        use(n, at=n + 1)  # 0, 1, 2 kept
    use(0, at=10)  # read again: now the newest
    use(3, at=11)  # a fourth: 1 (used longest ago) goes
    kept = sorted(json.loads(e.read_text())["pool"][0] for e in cache.glob("t-*.json"))
    assert kept == ["pool 0", "pool 2", "pool 3"]
    use(1, at=12)
    assert builds[1].calls == 2 and builds[0].calls == 1  # 1 was built again, 0 never
    assert (cache / "notes.json").exists()
