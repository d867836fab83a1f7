"""grpc_api/in_flight.py: API server 0's GetLoads adds the other API servers' published in-flight counts
per rank to its own (each server writes its own row of one shared array)."""
from __future__ import annotations

import multiprocessing

from services.frontend.grpc_api.in_flight import InFlightBoard


def test_each_server_sees_the_sum_of_the_others_rows() -> None:
    board = InFlightBoard(multiprocessing.get_context("spawn"), servers=3, ranks=2)
    assert [board.others(0, r) for r in range(2)] == [0, 0]
    board.publish(1, [4, 1])
    board.publish(2, [2, 0])
    board.publish(0, [7, 7])  # server 0's own row is not among its "others"
    assert [board.others(0, r) for r in range(2)] == [6, 1]
    assert [board.others(1, r) for r in range(2)] == [9, 7]
    board.publish(1, [0, 3])  # a newer count replaces the row
    assert [board.others(0, r) for r in range(2)] == [2, 3]
