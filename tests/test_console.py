"""What a user sees: the console's lines off a terminal, the logs under <run>/logs, errors."""

from __future__ import annotations

import io
import math
import os

import pytest

from spice_ray.common.console import CLOSE_LINE, PROGRESS_LINE, Console, fmt_seconds
from spice_ray.train.progress import ProgressReporter, TrainBar, describe_loss


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_plain_console_prints_one_line_per_event_and_heartbeats() -> None:
    out, clock = io.StringIO(), Clock()
    console = Console(out, live=False, heartbeat_s=30.0, clock=clock)
    console.stage(2, 5, "pretrain", "3 models")
    bar = console.bar("model 1/3 bandit spice seed 0", total=100, unit="step")
    for step in range(1, 61):
        clock.t = step  # one step per second: a heartbeat at 30 s and at 60 s
        bar.update(1, status=f"epoch 1/2, loss {1 / step:.3f}")
    bar.close("2 epochs, loss 0.100")
    lines = out.getvalue().splitlines()
    assert lines == [
        "[2/5] pretrain: 3 models",
        "  model 1/3 bandit spice seed 0: 30/100 step, epoch 1/2, loss 0.033, ETA 1 min 10 s",
        "  model 1/3 bandit spice seed 0: 60/100 step, epoch 1/2, loss 0.017, ETA 40 s",
        "  model 1/3 bandit spice seed 0: 2 epochs, loss 0.100 (1 min 00 s)",
    ]
    assert console.lines == 4


def test_a_slow_machines_heartbeats_parse_before_and_after_an_eta_exists() -> None:
    """The figures stage on a loaded machine: its first heartbeat comes before any rate exists
    (no ETA), the next with one; a unit of two words. Each line is one of the console's two
    documented grammars, and the test of a study's console parses those, not a timing."""
    out, clock = io.StringIO(), Clock()
    console = Console(out, live=False, heartbeat_s=30.0, clock=clock)
    figures = console.bar("figures", total=30, unit="table")
    for i, table in enumerate(("bandit_offline", "bandit_online", "bandit_robust"), start=1):
        clock.t = 40.0 * i  # 40 s a table: a heartbeat at each
        figures.update(1, status=table)
    figures.close("30 PNG files")
    grid = console.bar("tune", total=337, unit="grid point")
    clock.t += 31
    grid.update(5)
    lines = out.getvalue().splitlines()
    assert lines == ["  figures: 1/30 table, bandit_offline",
                     "  figures: 2/30 table, bandit_online, ETA 18 min 40 s",
                     "  figures: 3/30 table, bandit_robust, ETA 18 min 00 s",
                     "  figures: 30 PNG files (2 min 00 s)",
                     "  tune: 5/337 grid point"]
    parsed = [PROGRESS_LINE.fullmatch(line) for line in lines]
    assert [(m["done"], m["status"], m["eta"]) for m in parsed[:3]] == [
        ("1", "bandit_offline", None), ("2", "bandit_online", "18 min 40 s"),
        ("3", "bandit_robust", "18 min 00 s")]
    assert parsed[3] is None and CLOSE_LINE.fullmatch(lines[3])["took"] == "2 min 00 s"
    assert parsed[4]["unit"] == "grid point" and parsed[4]["status"] is None


def test_train_progress_is_throttled_and_names_loss_components() -> None:
    out, clock = io.StringIO(), Clock()
    console = Console(out, live=False, heartbeat_s=0.0, clock=clock)
    shown = []
    bar = console.bar("m", total=10, unit="step")
    reporter = ProgressReporter(lambda s: (shown.append(s), TrainBar(bar)(s)), epochs=2,
                                interval_s=5.0, clock=clock)
    import torch

    comps = {"loss": torch.tensor(0.5), "policy": torch.tensor(0.3), "td": torch.tensor(0.1),
             "shrink": torch.tensor(0.05), "anchor": torch.tensor(0.05),
             "weight_mean": torch.tensor(1.0)}
    for step in range(1, 11):
        clock.t = step
        reporter.step(step, 10, (step - 1) // 5, comps)
    assert [s["step"] for s in shown] == [1, 6, 10]  # every 5 s, and the last step
    assert "epoch 2/2, loss 0.500 (policy 0.300, td 0.100, shrink 0.050, anchor 0.050)" \
        in out.getvalue()
    assert describe_loss({"train_loss": 0.2, "train_policy": 0.2}, "train_") == "loss 0.200"


def test_fmt_seconds() -> None:
    assert [fmt_seconds(s) for s in (4.4, 65, 3725)] == ["4 s", "1 min 05 s", "1 h 02 min"]
    assert [fmt_seconds(s) for s in (float("inf"), float("nan"), -float("inf"))] == [
        "unknown", "unknown", "unknown"]


def test_no_eta_before_a_rate_exists_and_none_ever_crashes() -> None:
    """Off a terminal a heartbeat before the first unit finished used to format an infinite
    ETA and kill the run (OverflowError): a sweep piped to a file died on its first line."""
    out, clock = io.StringIO(), Clock()
    console = Console(out, live=False, heartbeat_s=30.0, clock=clock)
    bar = console.bar("sweep kernel_beta", total=6, unit="trial")
    clock.t = 31.0
    bar.update(0, status="0 done")  # a heartbeat with nothing finished: no ETA, no error
    clock.t = 62.0
    bar.update(1, status="1 done")  # one unit: still no rate
    assert bar.eta() is None
    clock.t = 93.0
    bar.update(1, status="2 done")  # now a rate: 1 trial per 31 s, 4 left
    bar.close("6 trials")
    lines = out.getvalue().splitlines()
    assert lines == ["  sweep kernel_beta: 0/6 trial, 0 done",
                     "  sweep kernel_beta: 1/6 trial, 1 done",
                     "  sweep kernel_beta: 2/6 trial, 2 done, ETA 2 min 04 s",
                     "  sweep kernel_beta: 6 trials (1 min 33 s)"]


def test_first_step_start_up_does_not_inflate_the_eta() -> None:
    """The first training step pays compilation and worker start (here 60 s); later steps take
    1 s each: the ETA is the steps left at 1 s, not at the first step's pace."""
    out, clock = io.StringIO(), Clock()
    console = Console(out, live=False, heartbeat_s=30.0, clock=clock)
    bar = console.bar("model 1/1", total=310, unit="step")
    clock.t = 60.0
    bar.update(1)
    assert bar.eta() is None and "ETA" not in out.getvalue()
    clock.t = 100.0
    bar.update(40)
    assert bar.eta() == 269.0



def test_live_bar_shows_no_eta_until_a_rate_exists(monkeypatch) -> None:
    """On a terminal tqdm's own ETA counted from the bar's creation: after a first step of 60 s
    (compilation) a 310-step model read '1/310 [01:00<5:09:00, 60.00s/step]'. The live bar
    shows the console's ETA, measured from the first progress, and none before it exists."""
    import tqdm.std

    clock = Clock()
    monkeypatch.setattr(tqdm.std, "time", clock)  # tqdm's elapsed on the same fake clock
    console = Console(io.StringIO(), live=True, clock=clock)
    bar = console.bar("model 1/1", total=310, unit="step")
    clock.t = 60.0
    bar.update(1, status="epoch 1/1")
    assert str(bar._tqdm).endswith("| 1/310 [01:00, epoch 1/1]")
    clock.t = 100.0
    bar.update(40)  # 40 steps in 40 s since the first: 269 left at 1 s each
    assert str(bar._tqdm).endswith("| 41/310 [01:40, ETA 4 min 29 s, epoch 1/1]")
    bar.close()


def test_a_live_bar_at_120_columns_keeps_its_eta_and_cuts_the_loss_parts(monkeypatch) -> None:
    """SPICE's five loss parts made a training bar longer than a 120-column terminal, and tqdm
    cuts a line at the terminal's width from its end, where the ETA was."""
    import tqdm.std

    clock = Clock()
    monkeypatch.setattr(tqdm.std, "time", clock)
    console = Console(io.StringIO(), live=True, clock=clock)
    bar = console.bar("7/9 bandit_latent: 3 models in one job", total=3600, unit="step")
    bar._tqdm.dynamic_ncols = lambda fp: (120, 40)  # a terminal 120 columns wide
    status = ("spice seed 2 epoch 3/5, " + describe_loss(
        {"loss": 1.05, "policy": 0.081, "td": 0.118, "shrink": 0.036, "anchor": 38.451,
         "var": -0.573}))
    clock.t = 10.0
    bar.update(1, status=status)
    clock.t = 310.0
    bar.update(2961, status=status)
    line = str(bar._tqdm)
    assert len(line) == 120 and "anchor" not in line  # cut in the loss parts ...
    assert line.endswith("| 2962/3600 [05:10, ETA 1 min 05 s, spice seed 2 epoch 3/5, loss "
                         "1.050 (po")  # ... and only there
    bar.close()


def test_the_console_never_raises_on_any_clock_or_progress() -> None:
    """Whatever the clock reads (zero elapsed, going backwards, inf, nan) and however the work
    moves, a bar prints and closes without raising, and shows an ETA only once a rate
    exists: a second update that moved past the first progress, in positive time."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    times = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(
        [0.0, -1.0, 1e-300, 1e308, float("inf"), float("nan")]))

    @settings(max_examples=300, deadline=None)
    @given(total=st.integers(-2, 400), start=times,
           steps=st.lists(st.tuples(times, st.integers(-3, 500), st.booleans()), max_size=8))
    def check(total: int, start: float, steps: list[tuple[float, int, bool]]) -> None:
        for live in (False, True):
            out, clock = io.StringIO(), Clock()
            clock.t = start
            console = Console(out, live=live, heartbeat_s=0.0, clock=clock)
            bar = console.bar("m", total=total, unit="step")
            advancing = 0
            for t, n, absolute in steps:
                clock.t = t
                before = bar.done
                if absolute:
                    bar.update(done=n)
                else:
                    bar.update(n, status=f"at {t}")
                eta = bar.eta()
                assert eta is None or (math.isfinite(eta) and eta >= 0)
                advancing += bar.done > before
                if advancing < 2:
                    assert eta is None and "ETA" not in out.getvalue()
                assert fmt_seconds(t) and fmt_seconds(eta or 0.0)
            bar.close("done")
            if not live:  # every line in the documented grammar, whatever the clock did
                *progress, close = out.getvalue().splitlines()
                assert CLOSE_LINE.fullmatch(close)["desc"] == "m", close
                for line in progress:
                    fields = PROGRESS_LINE.fullmatch(line)
                    assert fields and fields["desc"] == "m" and fields["unit"] == "step", line
                    assert int(fields["total"]) == max(1, total), line

    check()

def test_signals_end_a_run_in_one_line_with_the_signals_exit_status(capsys, monkeypatch
                                                                    ) -> None:
    """SIGINT (Ctrl-C) and SIGTERM used to print 'failed' and exit 1 (SIGTERM: 134 with a Ray
    stack): now the unit at work says 'stopped', one line names the signal, the status is
    128 + signal, Ray is stopped, and the previous handlers come back. (Ray's stop is recorded,
    not done: this process may hold the test session's Ray, which later tests use.)"""
    import signal
    import time

    import pytest

    from spice_ray.runtime import cli
    from spice_ray.runtime.cli import run_main

    stops = []
    monkeypatch.setattr(cli, "_stop_quietly", lambda: stops.append(1))

    before = signal.getsignal(signal.SIGTERM)
    for sig, code in ((signal.SIGTERM, 143), (signal.SIGINT, 130)):
        out = io.StringIO()
        console = Console(out, live=False)

        def work(sig: signal.Signals = sig, console: Console = console) -> None:
            bar = console.bar("model 1/1", total=10, unit="step")
            try:
                os.kill(os.getpid(), sig)
                time.sleep(5)  # the handler interrupts this
            except BaseException as exc:
                bar.abort(exc)
                raise

        with pytest.raises(SystemExit) as stop:
            run_main(work)
        assert stop.value.code == code
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"stopped by {sig.name}")
        assert "run the same command again to resume" in err[0]
        assert out.getvalue().startswith("  model 1/1: stopped (")
    assert signal.getsignal(signal.SIGTERM) is before and len(stops) == 2


def test_what_a_library_prints_goes_to_the_log_not_the_console(caplog) -> None:
    import contextlib
    import io
    import logging

    from spice_ray.common.console import Console, printed_to_log

    out = io.StringIO()
    console = Console(stream=out, live=False)
    caplog.set_level(logging.INFO)
    with contextlib.redirect_stdout(io.StringIO()) as terminal:
        with printed_to_log(logging.getLogger("lib")):
            print("banner\n\nmore", end="")
            console.line("ours")
            print(" and the rest")
        print("after")
    assert [r.getMessage() for r in caplog.records if r.name == "lib"] == [
        "banner", "more and the rest"]
    assert out.getvalue() == "ours\n" and terminal.getvalue() == "after\n"


_CTRL_C_IN_TUNING = """
import os, signal, sys, time
import ray
from ray import tune
from spice_ray.runtime import tune_engine as engine
from spice_ray.runtime.cli import run_main

class CtrlC(tune.Callback):  # in the driver: Ctrl-C as soon as the first trial starts
    def on_trial_start(self, iteration, trials, trial, **info):
        os.kill(os.getpid(), signal.SIGINT)

def slow(config):
    time.sleep(120)

ray.init(address=sys.argv[2], logging_level="ERROR", log_to_driver=False)
tuner = engine.new_tuner(slow, name="ctrl-c", storage=sys.argv[1], max_concurrent=1,
                         max_failures=0, callbacks=[CtrlC()],
                         param_space={"a": tune.grid_search([1, 2])})
run_main(engine.fit, tuner, "ctrl-c")
"""


@pytest.mark.ray
def test_ctrl_c_in_a_tune_fit_stops_the_run_in_one_line_with_status_130(ray_local,
                                                                        tmp_path) -> None:
    """Tune's own SIGINT handler ended the fit quietly with its trials unfinished, so a Ctrl-C
    in the study's tuning stage came out as a traceback ('grid points have no score'). Through
    the engine's fit it stops as any other stage: one line, status 130, without waiting for
    the trial in flight. The driver joins the session's Ray (its trial ends with it)."""
    import subprocess
    import sys
    from pathlib import Path

    address = ray_local.get_runtime_context().gcs_address
    proc = subprocess.run([sys.executable, "-c", _CTRL_C_IN_TUNING, str(tmp_path), address],
                          capture_output=True, text=True, timeout=110, env=dict(
                              os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1])))
    assert proc.returncode == 130, proc.stderr[-3000:]
    lines = proc.stderr.splitlines()
    assert any(line.startswith("stopped by SIGINT (Ctrl-C): every finished") for line in lines)
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
