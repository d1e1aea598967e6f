"""Training batches drawn ahead of the step that needs them: in a daemon thread, or in the training thread (depth 0).

Step s trains on global samples [s·B, (s+1)·B), a pure function of (data_seed, s), so a batch drawn early, late or
in another thread holds the same tensors: training is bit-identical with prefetch on or off, fresh or resumed.
"""

from __future__ import annotations

import queue
import threading
from functools import partial

import torch

THREAD_NAME = "gptlab-prefetch"
_POLL_S = 0.1  # how often a waiting side looks whether the other has gone (never a hang on a dead thread)


def rank_slices(step: int, batch_size: int, grad_accum: int, rank: int, world: int) -> list[tuple[int, int]]:
    """(first sample, count) of this rank's share of each micro-batch of `step`, whatever grad_accum or world."""
    micro_bs = batch_size // grad_accum
    per_rank = micro_bs // world  # run.py refuses a batch_size not divisible by grad_accum × world
    return [(step * batch_size + m * micro_bs + rank * per_rank, per_rank) for m in range(grad_accum)]


def draw(data, step: int, batch_size: int, grad_accum: int, rank: int, world: int, pin: bool) -> list:
    """This rank's CPU micro-batches of `step`: [(x, y)] with x, y (per_rank, T) int64, pinned when `pin` (CUDA);
    [(x, y, docs)] with the (per_rank, T) int32 document ids when the data packs documents (data.doc_mask)."""
    out = []
    documents = getattr(data, "doc_mask", False)
    for first, count in rank_slices(step, batch_size, grad_accum, rank, world):
        batch = data.train_samples(first, count)  # (x, y), (count, T) each
        if documents:
            batch = (*batch, data.train_documents(first, count))
        out.append(tuple(t.pin_memory() for t in batch) if pin else batch)
    return out


class InThread:
    """Depth 0: the training thread draws each step's batches when it asks for them (the path before prefetch)."""

    def __init__(self, draw_step):
        self._draw = draw_step

    def take(self, step: int) -> list:
        return self._draw(step)

    def close(self) -> None:
        pass


class Prefetcher:
    """Steps start..stop-1 drawn in order by a daemon thread, at most `depth` steps ahead of those taken.

    take(step) hands them out in the same order (a skipped non-finite step is not redrawn: the loop goes on to
    the next step); an exception raised while drawing is raised again by take() (the same object: its type and
    message). close() stops the thread and waits for it; call it in a finally.
    """

    def __init__(self, draw_step, start: int, stop: int, depth: int, device: str = "cpu"):
        self._draw, self._next, self._stop = draw_step, start, stop
        self._room = threading.Semaphore(depth)  # steps the thread may draw before the training thread takes one
        self._ready: queue.SimpleQueue = (
            queue.SimpleQueue()
        )  # (step, batches or None, exception or None), in step order
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(start, device), name=THREAD_NAME, daemon=True)
        self._thread.start()

    def _run(self, start: int, device: str) -> None:
        step = start
        try:
            if device.startswith("cuda"):
                torch.cuda.set_device(torch.device(device))  # pinned buffers belong to this rank's GPU, not cuda:0
            for step in range(start, self._stop):
                while not self._room.acquire(timeout=_POLL_S):
                    if self._closed.is_set():
                        return
                if self._closed.is_set():
                    return
                self._ready.put((step, self._draw(step), None))
        except BaseException as err:  # the training thread raises it (never swallowed)
            self._ready.put((step, None, err))

    def take(self, step: int) -> list:
        """The CPU batches of `step` (the next one in order), waiting for the thread if it is behind."""
        if step != self._next:
            raise RuntimeError(f"prefetch: step {step} asked for, but step {self._next} is next (taken in order)")
        while True:
            try:
                got, batches, err = self._ready.get(timeout=_POLL_S)
                break
            except queue.Empty:
                if not self._thread.is_alive() and self._ready.empty():
                    raise RuntimeError(
                        f"prefetch: the batch thread ended before step {step} (it draws steps up to {self._stop - 1})"
                    ) from None
        self._next += 1
        self._room.release()
        if err is not None:
            raise err
        return batches

    def close(self) -> None:
        """Stop drawing, wait for the thread (at most the batch it is drawing), free what it drew ahead."""
        self._closed.set()
        self._thread.join()
        while not self._ready.empty():
            self._ready.get_nowait()


def batch_source(data, settings, rank: int, world: int, device: str, start: int) -> InThread | Prefetcher:
    """The batches of steps start, start+1, ...: `settings.prefetch` steps ahead in a thread, or in-thread when 0."""
    draw_step = partial(
        draw,
        data,
        batch_size=settings.batch_size,
        grad_accum=settings.grad_accum,
        rank=rank,
        world=world,
        pin=device.startswith("cuda"),
    )
    if settings.prefetch == 0:
        return InThread(draw_step)
    return Prefetcher(draw_step, start, settings.max_steps, settings.prefetch, device)
