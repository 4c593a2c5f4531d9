"""A stand-in accelerator driver for the pinning tests (``_pinning.cuda_host.slot_pinning``'s calls), and
the slow-stream check those tests run on a real GPU."""

from __future__ import annotations

import torch
import torch.utils.data as tud

from rloader._pinning import cuda_host, policy


class Event:
    def __init__(self, done: bool) -> None:
        self.done = done
        self.synchronized = False

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.synchronized = self.done = True


class Driver:
    """cudaHostRegister and events, as far as rloader's pinning can tell."""

    def __init__(self, events_done: bool = True, refuse: bool = False) -> None:
        self.ranges: dict = {}
        self.events: list = []
        self.events_done = events_done
        self.refuse = refuse
        self.refuse_after: "int | None" = None  # registrations granted before refusing
        self.registrations = 0

    def register(self, addr: int, length: int) -> None:
        if self.refuse or self.registrations == self.refuse_after:
            self.refuse = True
            raise RuntimeError("cudaHostRegister refused (test)")
        for at, n in self.ranges.items():
            assert addr + length <= at or at + n <= addr, "overlapping registrations"
        self.ranges[addr] = length
        self.registrations += 1

    def unregister(self, addr: int) -> None:
        del self.ranges[addr]

    def fence(self) -> Event:
        event = Event(self.events_done)
        self.events.append(event)
        return event

    @classmethod
    def installed(cls, monkeypatch) -> "Driver":
        """A driver that rloader's pinning calls instead of CUDA's, for one test."""
        d = cls()
        monkeypatch.setattr(
            cuda_host, "slot_pinning", lambda: (d.register, d.unregister, lambda: d.fence())
        )
        # No accelerator here: "pinning" is pin_batch's pass-through for what is pinned already.
        monkeypatch.setattr(
            policy, "pin_plan", lambda loader: (lambda b: b) if loader.pin_memory else None
        )
        return d

    def covers(self, ptr: int, nbytes: int) -> bool:
        return any(at <= ptr and ptr + nbytes <= at + n for at, n in self.ranges.items())


def slow_stream_reads(loader, dataset, sleep_cycles: int, how: str = "side stream") -> int:
    """Moves every batch to the GPU with ``non_blocking=True`` behind a slow kernel, dropping it
    at once; returns how many batches the device read wrong (against torch's loader of
    ``dataset``). ``how``: the copies go on a side stream made current while the batch is
    dropped; on the default stream; or on a side stream that the default stream waits for, the
    batch dropped outside it (DataParallel's scatter)."""
    side = torch.cuda.Stream()
    moved = []
    for batch in loader:
        if how == "default stream":
            torch.cuda._sleep(sleep_cycles)  # the copy below waits for this on the stream
            moved.append(batch.to("cuda", non_blocking=True))
        else:
            with torch.cuda.stream(side):
                torch.cuda._sleep(sleep_cycles)
                moved.append(batch.to("cuda", non_blocking=True))
                if how == "side stream":
                    del batch  # released under the stream that reads it
                    continue
            torch.cuda.current_stream().wait_stream(side)
        del batch  # released before the device has read it
    torch.cuda.synchronize()
    expected = [b.cuda() for b in tud.DataLoader(dataset, batch_size=loader.batch_size)]
    assert len(moved) == len(expected), (len(moved), len(expected))
    return sum(not torch.equal(a, b) for a, b in zip(moved, expected))
