"""How `make test` shares the tests between its two workers (tests/conftest.py)."""

from __future__ import annotations

from tests.conftest import worker_scope


def test_a_file_stays_on_one_worker_and_the_nodes_tests_share_one():
    assert worker_scope("tests/e2e/test_job.py::test_state_reset_needs_yes") == "tests/e2e/test_job.py"
    assert worker_scope("tests/e2e/test_job.py::test_bad_input[server]") == "tests/e2e/test_job.py"
    assert worker_scope("tests/delivery/test_crash.py::test_crash_at_every_step_boundary[1-token-only]") == \
        "tests/delivery/test_crash.py"
    node = {worker_scope(f"tests/node/{f}::test_x") for f in ("test_images.py", "test_node.py", "test_product.py")}
    assert node == {"tests/node"}


def test_the_scopes_that_need_the_background_build_run_last_each_whole_and_in_order():
    from tests.conftest import late_last

    ids = ["tests/core/test_a.py::t1", "tests/operator/test_b.py::t1", "tests/operator/test_b.py::t2",
           "tests/node/test_images.py::t1", "tests/e2e/test_c.py::t1", "tests/node/test_product.py::t1",
           "tests/e2e/test_c.py::t2"]
    fixtures = [set(), {"tmp_path"}, {"kube"}, set(), {"kafka"}, {"node", "kube"}, set()]
    order, late = late_last(ids, fixtures)
    assert late == {"tests/operator/test_b.py", "tests/node"}
    assert [ids[i] for i in order] == [
        "tests/core/test_a.py::t1", "tests/e2e/test_c.py::t1", "tests/e2e/test_c.py::t2",
        "tests/operator/test_b.py::t1", "tests/operator/test_b.py::t2", "tests/node/test_images.py::t1",
        "tests/node/test_product.py::t1"]


def test_waiting_for_the_background_build_is_not_the_tests_time(tmp_path):
    """A test of a scope that needs the background build, started while the build still holds its lock, waits
    for it before its timeout starts (here 2 s against a 5 s build): it passes, as does the rest of its scope. With
    the wait inside the test's time, as `cached` alone waits, it would fail on its timeout."""
    import os
    import subprocess
    import sys
    import time

    from hack.testbed.process import REPO

    cache = tmp_path / "cache"
    cache.mkdir()
    (tmp_path / "conftest.py").write_text(
        "import pytest\n"
        "from hack.testbed.process import await_provisioning\n"
        "from tests.conftest import pytest_collection_modifyitems, pytest_runtest_protocol\n"
        "@pytest.fixture\n"
        "def kube():\n"
        "    await_provisioning()  # as `cached` does for a part not built yet\n")
    (tmp_path / "test_late.py").write_text("def test_needs_the_build(kube):\n    pass\n"
                                           "def test_beside_it():\n    pass\n")
    (tmp_path / "pytest.ini").write_text("[pytest]\ntimeout = 2\n")
    build = subprocess.Popen(["flock", "-x", str(cache / "provision-late.lock"), "sleep", "5"])
    try:
        while not held(cache / "provision-late.lock"):
            time.sleep(0.05)
        env = dict(os.environ, CHSINK_CACHE=str(cache), PYTHONPATH=str(REPO))
        res = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", str(tmp_path)],
                             cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    finally:
        build.wait(30)
    assert res.returncode == 0 and "2 passed" in res.stdout, res.stdout[-3000:]


def held(lock) -> bool:
    import fcntl

    if not lock.exists():
        return False
    with open(lock) as f:
        try:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
    return False
