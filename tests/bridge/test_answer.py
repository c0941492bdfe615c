"""An answer's life in-process (`runtime/bridge/answer.py`), on an ASGI `send` whose timing the test sets:
`ClientWatch` leaves a client that left or stopped reading and takes back its own cancellation, never
another's (a shutdown's); `Outbox` pings a silent stream and stops pinging when the stream ends. The
bridge's processes meet real clients in test_faults.py and test_sharing.py; these are the orders of
events that no real client can be timed to play."""

from __future__ import annotations

import asyncio
import contextlib
from types import SimpleNamespace
from typing import Any

import pytest

from runtime.bridge.answer import GONE, STALLED, Answer, ClientWatch, Outbox
from runtime.bridge.connection import CONNECTION
from runtime.bridge.trace import Trace

PING = b": ping\n\n"


class Client:
    """An ASGI `send` that keeps the bodies written; writes go out one at a time (a socket), each taking
    `delay_s`, or waiting for good once `reading` is off (a client's full socket)."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.delay_s = delay_s
        self.reading = True
        self.bodies: list[bytes] = []
        self.socket = asyncio.Lock()

    async def send(self, message: dict[str, Any]) -> None:
        async with self.socket:
            if not self.reading:
                await asyncio.Event().wait()
            await asyncio.sleep(self.delay_s)
            if message["type"] == "http.response.body":
                self.bodies.append(message["body"])


async def forever() -> None:
    await asyncio.sleep(3600)


async def nothing_to_receive() -> dict[str, Any]:
    raise AssertionError("an answer watches its connection, it reads nothing")


def test_a_client_that_leaves_ends_the_work_and_the_task_goes_on_uncancelled() -> None:
    async def main() -> tuple[str | None, list[str], int]:
        gone: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        closed: list[str] = []

        async def work() -> None:
            try:
                await forever()
            finally:
                closed.append("upstream")  # where the upstream response closes, and vLLM is told to abort

        asyncio.get_running_loop().call_later(0.01, gone.set_result, None)
        left = await ClientWatch(Outbox(Client().send), 60, gone).run(work())
        await asyncio.sleep(0.01)  # the task serves on (the trace, the accounting): no cancellation left in it
        task = asyncio.current_task()
        assert task is not None
        return left, closed, task.cancelling()

    assert asyncio.run(main()) == (GONE, ["upstream"], 0)


@pytest.mark.parametrize("order", ["shutdown", "client_gone_then_shutdown", "shutdown_then_client_gone"])
def test_a_shutdowns_cancellation_goes_on_whoever_else_cancels(order: str) -> None:
    """The server cancels the request's task (a shutdown): the watch never swallows that, even when the
    client leaves at the same moment."""

    async def main() -> list[str]:
        gone: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        seen: list[str] = []

        async def serve() -> None:
            try:
                seen.append(str(await ClientWatch(Outbox(Client().send), 60, gone).run(forever())))
            except asyncio.CancelledError:
                seen.append("cancelled")
                raise

        task = asyncio.create_task(serve())
        await asyncio.sleep(0.01)
        if order == "client_gone_then_shutdown":
            gone.set_result(None)
            await asyncio.sleep(0)  # the watch's callback runs: it cancels first
        task.cancel()
        if order == "shutdown_then_client_gone":
            gone.set_result(None)
        with pytest.raises(asyncio.CancelledError):
            await task
        return seen

    assert asyncio.run(main()) == ["cancelled"]


def test_work_that_swallows_the_cancellation_still_has_it_taken_back() -> None:
    async def main() -> tuple[str | None, int]:
        gone: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        async def work() -> None:
            with contextlib.suppress(asyncio.CancelledError):  # as a careless `except BaseException` would
                await forever()

        asyncio.get_running_loop().call_later(0.01, gone.set_result, None)
        left = await ClientWatch(Outbox(Client().send), 60, gone).run(work())
        task = asyncio.current_task()
        assert task is not None
        return left, task.cancelling()

    assert asyncio.run(main()) == (GONE, 0)


def test_a_client_gone_as_the_work_ends_cancels_nothing_after() -> None:
    """The connection closes in the work's last step: the watch's callback, already scheduled, finds the
    answer over and cancels nothing (else the request's task would be cancelled in its accounting)."""

    async def main() -> str | None:
        gone: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        async def work() -> None:
            gone.set_result(None)

        left = await ClientWatch(Outbox(Client().send), 60, gone).run(work())
        await asyncio.sleep(0.01)  # would raise CancelledError here
        return left

    assert asyncio.run(main()) is None


def test_a_client_that_stops_reading_is_left_and_one_that_reads_slowly_is_not() -> None:
    async def main(client: Client, writers: int, writes: int, stall_s: float) -> str | None:
        gone: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        out = Outbox(client.send)

        async def writer() -> None:
            for _ in range(writes):
                await out.write(b"x")

        async def work() -> None:
            await asyncio.gather(*(writer() for _ in range(writers)))

        return await ClientWatch(out, stall_s, gone).run(work())

    stopped = Client()
    stopped.reading = False
    assert asyncio.run(main(stopped, 1, 1, 0.05)) == STALLED
    # 16 writes of 0.05 s each: longer than the stall time, each well within it. Two writers (a stream and
    # its pings) keep one always waiting: what counts is that writes complete.
    slow = Client(delay_s=0.05)
    assert asyncio.run(main(slow, 2, 8, 0.5)) is None and slow.bodies == [b"x"] * 16


def test_a_silent_stream_is_pinged_and_the_pings_end_with_it() -> None:
    async def main() -> tuple[list[bytes], list[bytes], set[asyncio.Task[Any]]]:
        client = Client()
        out = Outbox(client.send)
        said: list[bytes] = [b"message_start;"]

        async def before() -> bytes:  # what must precede the first ping, said once
            return said.pop() if said else b""

        await out.start(200, [], PING, 0.02, before)
        await asyncio.sleep(0.2)
        await out.write(b"token;")
        await out.end(b"end;")
        streamed = list(client.bodies)
        await asyncio.sleep(0.1)  # no ping after the end
        return streamed, client.bodies, asyncio.all_tasks()

    streamed, bodies, tasks = asyncio.run(main())
    assert streamed[0] == b"message_start;" + PING and set(streamed[1:-2]) <= {PING} and len(streamed) >= 4
    assert streamed[-2:] == [b"token;", b"end;"] and bodies == streamed
    assert len(tasks) == 1  # the test's own: no ping task left


def test_a_ping_stuck_in_a_full_socket_is_cancelled_when_the_stream_stops() -> None:
    async def main() -> tuple[int, set[asyncio.Task[Any]]]:
        client = Client()
        out = Outbox(client.send)
        await out.start(200, [], PING, 0.01)
        client.reading = False
        await asyncio.sleep(0.1)  # a ping waits on the socket
        assert out.waiting == 1
        out.stop()  # as a stream that ends or errors does, in its `finally`
        await asyncio.sleep(0.01)
        return out.waiting, asyncio.all_tasks()

    waiting, tasks = asyncio.run(main())
    assert waiting == 0 and len(tasks) == 1


class Stuck(Answer):
    """An answer whose one write waits on its client."""

    def __init__(self, stall_s: float) -> None:
        self.serving = SimpleNamespace(stall_s=stall_s)  # type: ignore[assignment]  # all that `Answer` reads of it
        self.trace = Trace()

    async def serve(self, out: Outbox) -> None:
        await out.write(b"x")


@pytest.mark.parametrize("reading", [False, True], ids=["stalled", "gone"])
def test_an_answer_says_why_it_left_and_resets_only_a_stalled_client(reading: bool) -> None:
    async def main() -> tuple[Trace, list[str]]:
        gone: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        dropped: list[str] = []
        client = Client(delay_s=3600)  # a client still reading, whose write has not gone out yet
        client.reading = reading
        if reading:
            asyncio.get_running_loop().call_later(0.01, gone.set_result, None)
        answer = Stuck(stall_s=0.05 if not reading else 60)
        scope = {"extensions": {CONNECTION: {"gone": gone, "drop": lambda: dropped.append("drop")}}}
        await answer(scope, nothing_to_receive, client.send)
        return answer.trace, dropped

    trace, dropped = asyncio.run(main())
    assert trace == Trace(stop=GONE if reading else STALLED)
    assert dropped == ([] if reading else ["drop"])
