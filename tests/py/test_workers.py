"""generator.workers.in_order: results in order from worker processes,
at most `jobs` items taken ahead, one by one where no process can start."""
import concurrent.futures

import pytest

from sparseforge.generator.workers import in_order


def square(x):
    return x * x


@pytest.mark.parametrize("jobs", [1, 3])
def test_results_come_in_order_with_few_items_taken_ahead(jobs):
    taken = []

    def items():
        for i in range(7):
            taken.append(i)
            yield i

    got = []
    for r in in_order(square, items(), jobs, died="died at {i}"):
        got.append(r)
        assert len(taken) <= len(got) + jobs   # never more than `jobs` in flight
    assert got == [i * i for i in range(7)]
    assert list(in_order(square, [], jobs, died="died at {i}")) == []


def test_where_no_process_starts_it_works_one_by_one_and_says_so(monkeypatch, capsys):
    def refuse(*a, **k):
        raise PermissionError(1, "Operation not permitted")
    monkeypatch.setattr(concurrent.futures, "ProcessPoolExecutor", refuse)
    assert list(in_order(square, range(4), 2, died="died at {i}",
                         alone="note: alone ({error})")) == [0, 1, 4, 9]
    assert "note: alone ([Errno 1] Operation not permitted)" in capsys.readouterr().err
