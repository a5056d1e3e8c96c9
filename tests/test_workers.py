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
