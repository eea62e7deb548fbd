"""The report's plot shows a panel by GPU-hours only where SLURM accounted for some job of the runs; without
accounting (inline runs, local jobs: the demo) the panel is left out, and the report says why in one line."""

from __future__ import annotations

from probepo.report.summary import NO_GPU_HOURS_PLOT, RunCurves, figure, markdown


def _curves(run_id: str, gpu_hours: list[float]) -> RunCurves:
    return RunCurves(
        run_id=run_id,
        algorithm="grpo",
        eval_updates=[0, 2],
        accuracy=[0.25, 0.5],
        stderr=[0.01, 0.01],
        greedy=[],
        reward=[0.2, 0.3],
        sampled_tokens=[100.0, 200.0],
        wall_s=[1.0, 2.0],
        gpu_hours=gpu_hours,
    )


def _titles(curves: list[RunCurves]) -> list[str]:
    import matplotlib.pyplot as plt

    fig = figure(curves)
    titles = [ax.get_title() for ax in fig.axes]
    plt.close(fig)
    return titles


def test_without_accounting_the_gpu_hours_panel_is_left_out_and_the_report_says_why():
    inline = [_curves("inline", [])]
    assert not [title for title in _titles(inline) if "GPU-hours" in title]
    assert "by wall time" in _titles(inline)
    report = markdown(inline, "curves.png")
    assert report.count(NO_GPU_HOURS_PLOT) == 1 and "\n" not in NO_GPU_HOURS_PLOT
    assert report.index(NO_GPU_HOURS_PLOT) < report.index("![curves](curves.png)")


def test_with_one_accounted_run_the_panel_shows_and_nothing_is_said():
    import matplotlib.pyplot as plt

    both = [_curves("slurm", [0.5, 1.0]), _curves("inline", [])]
    fig = figure(both)
    gpu = [ax for ax in fig.axes if ax.get_title() == "by GPU-hours"]
    assert len(gpu) == 1 and len(gpu[0].get_lines()) == 1  # the accounted run's line alone
    plt.close(fig)
    assert NO_GPU_HOURS_PLOT not in markdown(both, "curves.png")
