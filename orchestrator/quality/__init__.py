"""Training-quality check: read a run's metrics from outside the process and judge it.

Pure stdlib (shipped to hosts with the agent). Entry points: ``judge.check(target, opts)``,
``sources.Tracker`` (incremental reading), ``judge.judge_tracker(tracker, opts)``, ``judge.judge(run, opts)``.
"""
