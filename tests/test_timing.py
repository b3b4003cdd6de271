"""Phase clocks: nested phases count each second once, scopes, and compilations moved out."""

import threading
import time

import jax
import jax.numpy as jnp
import pytest

from agentrl_jax import compile_cache, timing


def test_nested_phases_keep_their_own_seconds_and_sum_to_the_outer_time():
    clock = timing.PhaseClock()
    t0 = time.perf_counter()
    with clock.running(), timing.phase("text"):
        time.sleep(0.02)
        with timing.phase("env"):
            time.sleep(0.03)
        with timing.phase("sample"):
            time.sleep(0.01)
    wall = time.perf_counter() - t0
    s = clock.seconds
    assert s["env"] == pytest.approx(0.03, abs=0.015)
    assert s["sample"] == pytest.approx(0.01, abs=0.015)
    assert s["text"] == pytest.approx(0.02, abs=0.015)  # without its children's 0.04
    assert clock.total == pytest.approx(wall, abs=0.005)


def test_a_scope_records_its_phases_under_its_name():
    clock = timing.PhaseClock()
    with clock.running(), timing.phase("evaluate", scope=True):
        with timing.phase("sample"):
            pass
        with timing.phase("text"), timing.phase("env"):  # a plain phase inside keeps the scope
            pass
    assert set(clock.seconds) == {"evaluate", "evaluate/sample", "evaluate/text", "evaluate/env"}


def test_phase_is_a_no_op_without_a_running_clock():
    clock = timing.PhaseClock()
    with timing.phase("sample"):
        pass
    assert clock.total == 0 and not clock.seconds


def test_compilations_move_out_of_the_phase_that_triggered_them():
    clock = timing.PhaseClock()
    x = jnp.arange(7.0)
    fn = jax.jit(lambda v: jnp.cumsum(jnp.sin(v) * 3.0) + 0.123)  # a program no test compiled
    with clock.running(), timing.phase("sample"):
        fn(x).block_until_ready()
    assert clock.compilations >= 1
    assert clock.seconds["compile"] > 0
    assert clock.seconds["sample"] >= 0
    assert clock.total == pytest.approx(clock.seconds["sample"] + clock.seconds["compile"])
    before = timing.TOTALS.compilations
    with clock.running(), timing.phase("sample"):
        fn(x).block_until_ready()  # cached in the process: no compilation
    assert timing.TOTALS.compilations == before


def test_iteration_profile_coverage_and_busy_fraction():
    profile = timing.IterationProfile(
        iteration=2,
        wall_s=10.0,
        phases={"env": 3.0, "sample": 2.0, "update": 3.0, "evaluate/sample": 1.0, "log": 0.5},
        compilations=0,
        cache_hits=0,
    )
    assert profile.coverage == pytest.approx(0.95)
    assert profile.device_busy_fraction == pytest.approx(0.6)  # sample, update, evaluate/sample
    metrics = timing.phase_metrics(timing.PhaseClock())
    assert metrics["perf/device_busy_fraction"] == 0.0


def test_a_background_threads_device_time_counts_where_the_main_threads_does_not():
    """Asynchronous RL: the rollout played ahead samples in a thread of its own while the main
    thread updates, then waits for it. The device is busy the whole time: the update's seconds
    and the background's sampling after the update ends, counted once."""
    timing.install_listeners()  # imports jax.monitoring now, not inside a timed phase
    clock = timing.PhaseClock()
    background = timing.PhaseClock()

    def play():
        with background.running(), timing.phase("sample"):
            time.sleep(0.3)

    with clock.running():
        thread = threading.Thread(target=play)
        thread.start()
        with timing.phase("update"):
            time.sleep(0.1)
        with timing.phase("rollout_wait"):
            thread.join()
        timing.add_background(background)
    profile = timing.IterationProfile.of(1, clock.elapsed(), clock)
    assert profile.phases["background/sample"] == pytest.approx(0.3, abs=0.05)
    assert profile.background_busy_s == pytest.approx(0.2, abs=0.05)  # after the update
    assert profile.device_busy_fraction == pytest.approx(1.0, abs=0.15)
    assert profile.coverage == pytest.approx(1.0, abs=0.15)  # the background's not twice
    assert timing.phase_metrics(clock)["perf/device_busy_fraction"] == pytest.approx(1.0, abs=0.15)


def test_compile_cache_folder_default_and_off(monkeypatch, tmp_path):
    monkeypatch.setenv("AGENTRL_CACHE", str(tmp_path))
    assert compile_cache.default_dir() == str(tmp_path / "jax")
    assert compile_cache.enable("off") is None
