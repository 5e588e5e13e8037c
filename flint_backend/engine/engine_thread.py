"""EngineThread: the engine on its own thread, owning the device. Requests and aborts arrive
through a command queue and are applied between steps; outputs leave through per-request
callbacks (or a RequestStream to iterate)."""

from __future__ import annotations

import logging
import queue
import threading
import traceback
from typing import Callable, Iterator

from flint_backend.engine.engine import LLMEngine, RequestOutput
from flint_backend.engine.runner import use_device
from flint_backend.engine.sampling_params import SamplingParams

log = logging.getLogger(__name__)
OutputCallback = Callable[[RequestOutput], None]


class RequestStream:
    """Iterates a request's outputs until the final one."""

    def __init__(self, request_id: str):
        self.request_id = request_id
        self._queue: queue.Queue[RequestOutput] = queue.Queue()

    def put(self, output: RequestOutput) -> None:
        self._queue.put(output)

    def __iter__(self) -> Iterator[RequestOutput]:
        while True:
            output = self._queue.get()
            yield output
            if output.finished:
                return

    def tokens(self) -> list[int]:
        return [t for output in self for t in output.new_token_ids]


class EngineThread:
    def __init__(self, engine: LLMEngine):
        self.engine = engine
        self._commands: queue.Queue = queue.Queue()
        self._callbacks: dict[str, OutputCallback] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="flint-engine", daemon=True)
        self._thread.start()

    def add_request(self, prompt_ids: list[int], params: SamplingParams | None = None,
                    request_id: str | None = None, callback: OutputCallback | None = None) -> RequestStream | None:
        """Validates here (raises RequestError at once); runs on the engine thread."""
        seq = self.engine.make_sequence(prompt_ids, params, request_id)
        stream = None
        if callback is None:
            stream = RequestStream(seq.request_id)
            callback = stream.put
        self._commands.put(("add", seq, callback))
        return stream

    def abort(self, request_id: str) -> None:
        self._commands.put(("abort", request_id, None))

    def shutdown(self) -> None:
        self._stop.set()
        self._commands.put(("wake", None, None))
        self._thread.join()

    def _apply(self, command) -> None:
        kind, arg, callback = command
        if kind == "add":
            try:
                self.engine.admit(arg)
            except ValueError as e:  # duplicate request id
                callback(RequestOutput(arg.request_id, [], [], True, "error", arg.num_prompt_tokens, 0, str(e)))
                return
            self._callbacks[arg.request_id] = callback
        elif kind == "abort":
            output = self.engine.abort(arg)
            if output is not None:
                self._deliver([output])

    def _loop(self) -> None:
        use_device(self.engine.device)
        while not self._stop.is_set():
            block = not self.engine.has_work()
            try:
                while True:
                    self._apply(self._commands.get(block=block, timeout=0.1 if block else None))
                    block = False
            except queue.Empty:
                pass
            if not self.engine.has_work():
                continue
            try:
                outputs = self.engine.step()
            except Exception:  # a broken step must not take the server down; fail what was running
                error = traceback.format_exc()
                log.error("engine step failed:\n%s", error)
                outputs = self.engine.fail_all(error.strip().splitlines()[-1])
            self._deliver(outputs)
        for output in self.engine.fail_all("engine shut down"):
            self._deliver([output])

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        for output in outputs:
            callback = self._callbacks.get(output.request_id)
            if callback is None:
                continue
            if output.finished:
                del self._callbacks[output.request_id]
            try:
                callback(output)
            except Exception:
                log.exception("output callback for %s failed; aborting it", output.request_id)
                if not output.finished:
                    self.abort(output.request_id)
