"""Serving's takes watched for the host's speed (pipeline/stages/serving.py, ``watched``;
docs/streams.md, "The host's speed"): a take the host ran slower around is set aside and taken
again, the least slowed kept, and a count every take of which was slowed is marked in the reports."""

from __future__ import annotations

from types import SimpleNamespace

from pipeline.measuring.host_speed import HostTake
from pipeline.measuring.serving import THREADS, ServedRun, served_figures
from pipeline.report.streams import SLOWED_NOTE, stream_cells, streams_note
from pipeline.stages import serving


class _Host:
    """A host whose takes were slowed by the given factors, in turn."""

    def __init__(self, slowdowns, noise=1.0):
        self.slowdowns, self.noise, self.probed, self.seen_takes = list(slowdowns), noise, [], []

    def before_take(self, probe=False):
        self.probed.append(probe)

    def after_take(self):
        return HostTake(slowdown=self.slowdowns.pop(0), others_cpus=None, throttled=0.0)

    def seen(self, take):
        self.seen_takes.append(take.slowdown)


def _taker():
    taken = []

    def take():
        taken.append(len(taken))
        return ServedRun(1, THREADS, 1.0, 10 + len(taken), [1.0] * (10 + len(taken)))

    return take, taken


def test_a_take_the_host_ran_slower_around_is_taken_again_and_the_faster_kept():
    take, taken = _taker()
    host = _Host([1.5, 1.04])
    run = serving.watched(take, host)
    assert len(taken) == 2 and run.completed == 12  # the second take's run
    assert run.host_slowdown == 1.04 and run.host_set_aside == [1.5] and run.host_slowed is False
    assert host.probed == [True, True]  # each take's host probed just before it, not after the last


def test_a_take_within_the_bar_is_taken_once():
    take, taken = _taker()
    run = serving.watched(take, _Host([1.09]))
    assert len(taken) == 1 and run.host_set_aside == [] and run.host_slowed is False


def test_every_take_slowed_keeps_the_least_slowed_and_says_so():
    take, taken = _taker()
    run = serving.watched(take, _Host([1.5, 1.3, 1.4]))
    assert len(taken) == 1 + serving.RETAKES
    assert run.completed == 12 and run.host_slowdown == 1.3  # the second take, the least slowed
    assert sorted(run.host_set_aside) == [1.4, 1.5] and run.host_slowed is True


def test_the_hosts_own_noise_does_not_widen_the_bar():
    # A host whose speed changes in spells has a noise that is the spells: judged against its fastest.
    take, taken = _taker()
    host = _Host([1.5, 1.0], noise=1.6)
    run = serving.watched(take, host)
    assert len(taken) == 2 and run.host_slowdown == 1.0 and host.seen_takes == [1.5, 1.0]


def test_a_failed_retake_keeps_the_take_before_it():
    results = [ServedRun(1, THREADS, 1.0, 10, [1.0] * 10), ServedRun.cannot(1, THREADS, "failed: the GPU went away")]
    run = serving.watched(lambda: results.pop(0), _Host([1.5, 1.0]))
    assert run.completed == 10 and run.host_slowdown == 1.5 and run.host_slowed is True and run.host_set_aside == []


def test_the_reference_is_the_fastest_the_host_was_seen(monkeypatch):
    from pipeline.measuring import host_speed

    monkeypatch.setattr(host_speed, "_calibration", lambda helpers=frozenset(): (2.0, 1.5, 0.0))
    monkeypatch.setattr(host_speed, "_write_record", lambda alone, noise: None)
    monkeypatch.setattr(host_speed, "_read_record", lambda: (1.6, 1.0))
    host = host_speed.HostSpeed.at_its_fastest()
    assert host.alone_ms == 1.6 and host.source == "host record"  # the record was faster than this calibration
    host.seen(HostTake(slowdown=0.5, others_cpus=None, throttled=0.0))
    assert host.alone_ms == 0.8  # a take's probes showed it faster still
    host.seen(HostTake(slowdown=1.4, others_cpus=None, throttled=0.0))
    assert host.alone_ms == 0.8


def test_a_failed_take_is_not_taken_again():
    taken = []

    def take():
        taken.append(1)
        return ServedRun.cannot(2, THREADS, "out of memory")

    run = serving.watched(take, _Host([2.0, 1.0]))
    assert len(taken) == 1 and run.why_not == "out of memory" and run.host_slowed is None


def test_without_a_host_one_take_unwatched():
    take, taken = _taker()
    run = serving.watched(take, None)
    assert len(taken) == 1 and run.host_slowdown is None and run.host_slowed is None


def test_a_slowed_count_is_marked_in_the_tables_and_its_note():
    from pipeline.report.streams import served_entries

    slowed = ServedRun(1, THREADS, 2.0, 40, [50.0] * 40, host_slowdown=1.4, host_slowed=True, host_set_aside=[1.5, 1.6])
    fine = ServedRun(2, THREADS, 2.0, 80, [50.0] * 80, host_slowdown=1.0, host_slowed=False)
    entries = served_entries([served_figures(run, batch=1, tokens_per_run=None) for run in (slowed, fine)])
    assert entries[0]["host_set_aside"] == [1.5, 1.6] and entries[0]["host_slowdown"] == 1.4
    row = SimpleNamespace(variant="fp32", target="torch-eager", sample_unit="img")
    assert stream_cells(row, entries[0])[4] == "20.0*" and stream_cells(row, entries[1])[4] == "40.0"
    assert SLOWED_NOTE in streams_note(entries) and SLOWED_NOTE not in streams_note(entries[1:])
