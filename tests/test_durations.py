"""The fast tier (tests/conftest.py, `make durations` / `make test-fast`): --store-durations records each test's time
and each heavy shared fixture's setup, under xdist as `make test` runs; at collection `heavy` marks the tests recorded
at 1 s or more, every user of a fixture that took 5 s or more, whichever of them paid for it, and the light tests
past the fast budget (fastest kept first, a lighter fixture's setup counted once); a test the file does not know is
light. Checked with the real conftest on a scratch suite."""

from __future__ import annotations

import json
import re

from helpers.scratch import run_pytest, scratch_suite

SUITE = {
    "test_a.py": (
        "import time, pytest\n"
        "@pytest.fixture(scope='module')\n"
        "def shared():\n    time.sleep(1.1)\n    return 1\n"
        "def test_first_user(shared): assert shared == 1\n"
        "def test_second_user(shared): assert shared == 1\n"
        "def test_own_time(): time.sleep(1.1)\n"
        "def test_light(): pass\n"
    ),
    "test_b.py": "def test_other_light(): pass\n",
}
XDIST = ("-n", "2", "--dist", "loadgroup", "--no-loadscope-reorder")


def set_fast_budget(suite, seconds: float) -> None:
    """Set FAST_BUDGET_S in the scratch suite's copy of the real conftest."""
    conftest = suite / "conftest.py"
    text = conftest.read_text()
    assert "\nFAST_BUDGET_S = " in text
    conftest.write_text(re.sub(r"\nFAST_BUDGET_S = [0-9.]+", f"\nFAST_BUDGET_S = {seconds}", text))


def test_store_durations_under_xdist_records_plain_ids_and_the_heavy_fixture(tmp_path):
    scratch_suite(tmp_path, SUITE, markers=("heavy: recorded",))
    stored = run_pytest(tmp_path, "-q", *XDIST, "--store-durations", ".")
    assert stored.returncode == 0, stored.stdout[-3000:]
    doc = json.loads((tmp_path / "durations.json").read_text())
    assert doc["heavy_s"] == 1.0
    assert set(doc["tests"]) == {
        "test_a.py::test_first_user",
        "test_a.py::test_second_user",
        "test_a.py::test_own_time",
        "test_a.py::test_light",
        "test_b.py::test_other_light",
    }  # plain ids: no '@group' suffix of loadgroup
    assert doc["tests"]["test_a.py::test_own_time"] >= 1.1 and doc["tests"]["test_a.py::test_light"] < 1.0
    assert list(doc["fixtures"]) == ["test_a.py::shared"] and doc["fixtures"]["test_a.py::shared"] >= 1.1
    # only the user that set the fixture up holds its time: the other one is light by its own time
    assert min(doc["tests"]["test_a.py::test_first_user"], doc["tests"]["test_a.py::test_second_user"]) < 1.0


def test_not_heavy_leaves_out_heavy_tests_and_every_user_of_a_heavy_fixture_and_keeps_new_tests(tmp_path):
    files = {name: text.replace("time.sleep(1.1)", "pass") for name, text in SUITE.items()}
    files["test_b.py"] += "def test_new(): pass\n"  # not in the file: light until it is written again
    scratch_suite(tmp_path, files, markers=("heavy: recorded",))
    recorded = {
        "heavy_s": 1.0,
        "fixtures": {"test_a.py::shared": 6.0},  # SHARED_HEAVY_S or more: every user is heavy
        "tests": {
            "test_a.py::test_first_user": 6.05,
            "test_a.py::test_second_user": 0.01,
            "test_a.py::test_own_time": 1.1,
            "test_a.py::test_light": 0.99,
            "test_b.py::test_other_light": 0.01,
        },
    }
    (tmp_path / "durations.json").write_text(json.dumps(recorded))
    fast = run_pytest(tmp_path, "-v", *XDIST, "-m", "not heavy", ".")  # as make test-fast runs
    assert fast.returncode == 0, fast.stdout[-3000:]
    ran = set(re.findall(r"PASSED (test_\w+\.py::test_\w+)", fast.stdout))
    assert ran == {"test_a.py::test_light", "test_b.py::test_other_light", "test_b.py::test_new"}
    serial = run_pytest(tmp_path, "-q", "-m", "not heavy", ".")
    assert serial.returncode == 0 and "3 passed, 3 deselected" in serial.stdout, serial.stdout[-3000:]
    everything = run_pytest(tmp_path, "-q", ".")  # no -m: the mark selects nothing by itself
    assert everything.returncode == 0 and "6 passed" in everything.stdout, everything.stdout[-3000:]


def test_the_light_tests_past_the_fast_budget_are_heavy_fastest_kept_first(tmp_path):
    """Light tests count fastest first up to FAST_BUDGET_S of recorded time (here 1.0 s); slow ones spend none of
    it, and a test the file does not know counts 0 s."""
    light = "".join(f"def test_{name}(): pass\n" for name in ("t02", "t03", "t04", "t05", "new"))
    files = {"test_c.py": light + "import pytest\n@pytest.mark.slow\ndef test_slow_one(): pass\n"}
    scratch_suite(tmp_path, files, markers=("heavy: recorded", "slow: slow"))
    set_fast_budget(tmp_path, 1.0)
    times = {"t02": 0.2, "t03": 0.3, "t04": 0.4, "t05": 0.5, "slow_one": 0.1}
    recorded = {"heavy_s": 1.0, "fixtures": {}, "tests": {f"test_c.py::test_{k}": v for k, v in times.items()}}
    (tmp_path / "durations.json").write_text(json.dumps(recorded))
    fast = run_pytest(tmp_path, "-v", "-m", "not slow and not heavy", ".")
    assert fast.returncode == 0, fast.stdout[-3000:]
    ran = set(re.findall(r"test_c\.py::test_(\w+) PASSED", fast.stdout))
    assert ran == {"new", "t02", "t03", "t04"}  # 0 + 0.2 + 0.3 + 0.4 = 0.9 s; t05 would make 1.4 s


def test_a_lighter_fixture_keeps_its_users_in_the_tier_and_counts_its_setup_once(tmp_path):
    """A shared fixture under SHARED_HEAVY_S does not make its users heavy: the first of them kept spends its setup
    from the budget (FAST_BUDGET_S 1.5 s here), the others only their own time; a user whose fixture would push the
    tier past the budget is heavy, and a slower test without one after it still fits."""
    files = {
        "test_a.py": (
            "import pytest\n"
            "@pytest.fixture(scope='module')\n"
            "def shared():\n    return 1\n"
            + "".join(f"def test_user{i}(shared): assert shared == 1\n" for i in (1, 2, 3))
        ),
        "test_b.py": "def test_lone(): pass\ndef test_late(): pass\n",
        "test_c.py": "import pytest\n@pytest.fixture(scope='module')\ndef other():\n    return 1\n"
        "def test_other_user(other): assert other == 1\n",
    }
    scratch_suite(tmp_path, files, markers=("heavy: recorded",))
    set_fast_budget(tmp_path, 1.5)
    recorded = {
        "heavy_s": 1.0,
        "fixtures": {"test_a.py::shared": 1.2, "test_c.py::other": 1.3},
        "tests": {
            "test_a.py::test_user1": 1.25,  # set the fixture up in the recorded run: heavy by its own time
            "test_a.py::test_user2": 0.05,  # spends 0.05 + 1.2 s of the budget
            "test_a.py::test_user3": 0.06,  # the fixture already counted: 0.06 s (1.31 s spent)
            "test_c.py::test_other_user": 0.07,  # 1.31 + 0.07 + 1.3 > 1.5: heavy
            "test_b.py::test_lone": 0.1,  # 1.41 s
            "test_b.py::test_late": 0.3,  # 1.71 > 1.5: past the budget
        },
    }
    (tmp_path / "durations.json").write_text(json.dumps(recorded))
    fast = run_pytest(tmp_path, "-v", *XDIST, "-m", "not heavy", ".")
    assert fast.returncode == 0, fast.stdout[-3000:]
    ran = set(re.findall(r"PASSED (test_\w+\.py::test_\w+)", fast.stdout))
    assert ran == {"test_a.py::test_user2", "test_a.py::test_user3", "test_b.py::test_lone"}


def test_machine_probe_times_the_same_work_before_and_after_the_run_and_records_it(tmp_path):
    """--machine-probe (make test, make durations, CI): the controller times helpers.machine's fixed work before the
    workers start and after they end, prints both in one summary line and, with --store-durations, keeps them in
    durations.json; without the option there is no line and no key."""
    scratch_suite(tmp_path, {"test_b.py": "def test_one(): pass\n"})
    probed = run_pytest(tmp_path, "-q", *XDIST, "--store-durations", "--machine-probe", ".")
    assert probed.returncode == 0, probed.stdout[-3000:]
    numbers = r"(\d+) -> (\d+) ms"
    line = re.search(
        rf"^machine probe \(.*\): python {numbers}, matmul {numbers}, torch_start {numbers}$", probed.stdout, re.M
    )
    assert line, probed.stdout[-3000:]
    recorded = json.loads((tmp_path / "durations.json").read_text())["machine_probe"]
    kinds = ("python_ms", "matmul_ms", "torch_start_ms")
    assert set(recorded) == {"start", "end"} and all(set(t) == set(kinds) for t in recorded.values())
    shown = [int(v) for v in line.groups()]
    assert shown == [round(recorded[w][k]) for k in kinds for w in ("start", "end")]
    assert all(v > 0 for v in shown)
    plain = run_pytest(tmp_path, "-q", *XDIST, "--store-durations", ".")
    assert plain.returncode == 0 and "machine probe" not in plain.stdout
    assert "machine_probe" not in json.loads((tmp_path / "durations.json").read_text())
