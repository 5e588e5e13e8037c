"""flint_postprocess: engine chunks -> text, reasoning, tool calls (flint_backend.serving.postprocess).

Decoupled: each chunk answers with one response or none (a non-streamed request is
answered once, at its final chunk; chunks of one request handed over together answer once,
with the last of them). A stop string, a client that cancelled (the ensemble marks the
chunks it forwards after that as cancelled) or an error in this step aborts the engine
request through a control request to the engine model. Its EngineWatch stops tritonserver
when an engine's process dies (engine_lease.py).
"""

import json
import os
import sys
from pathlib import Path

# The Python backend's stub ignores PYTHONPATH; the launcher puts the project on it.
sys.path[:0] = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]

import triton_python_backend_utils as pb_utils  # noqa: E402

from flint_backend.serving import repository  # noqa: E402
from flint_backend.serving.chunks import chunk_from_arrays, text_arrays  # noqa: E402
from flint_backend.serving.engine_lease import EngineWatch  # noqa: E402
from flint_backend.serving.postprocess import Postprocessor  # noqa: E402
from flint_backend.serving.tensors import bytes_tensor  # noqa: E402
from flint_backend.tokenizer import load_tokenizer  # noqa: E402

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = repository.model_parameters(config)
        self.logger = pb_utils.Logger
        self.engine_model = params["engine_model"]
        self.input_names = [i["name"] for i in config["input"]]
        engine_args = repository.load_engine_args(
            repository.engine_args_path(Path(args["model_repository"]).parent, self.engine_model))
        self.post = Postprocessor(load_tokenizer(repository.tokenizer_dir(engine_args)))
        self.engine_watch = EngineWatch(log=self.logger.log_error).start()

    def execute(self, requests):
        batch = []
        for request in requests:
            sender = request.get_response_sender()
            try:
                tensors = {n: pb_utils.get_input_tensor_by_name(request, n) for n in self.input_names}
                chunk = chunk_from_arrays({n: t.as_numpy() for n, t in tensors.items() if t is not None})
            except Exception as error:
                self._fail(sender, error)
                continue
            if request.is_cancelled():
                if self.post.cancel(chunk.key, chunk.finished):
                    self._abort(chunk.key)
                sender.send(flags=FINAL)
            else:
                batch.append((sender, chunk))
        try:
            outcomes = self.post.process_all([chunk for _, chunk in batch])
        except Exception as error:  # Postprocessor fails a request alone; this is for its own faults
            for sender, chunk in batch:
                self._fail(sender, error)
                if self.post.cancel(chunk.key, chunk.finished):
                    self._abort(chunk.key)
            return None
        for (sender, chunk), outcome in zip(batch, outcomes):
            if outcome.abort_engine:
                self._abort(chunk.key)
            self._respond(sender, outcome.outputs[0] if outcome.outputs else None)
        return None

    def _respond(self, sender, delta):
        if delta is None:
            sender.send(flags=FINAL)  # nothing to say for this chunk
            return
        if delta.note:
            self.logger.log_warn(f"flint_postprocess: {delta.note}")
        if delta.error:
            code = pb_utils.TritonError.INVALID_ARG if delta.client_error else pb_utils.TritonError.INTERNAL
            sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(delta.error, code)), flags=FINAL)
            return
        tensors = [pb_utils.Tensor(name, array) for name, array in text_arrays(delta).items()]
        sender.send(pb_utils.InferenceResponse(tensors), flags=FINAL)

    def _fail(self, sender, error):
        self.logger.log_error(f"flint_postprocess: {type(error).__name__}: {error}")
        sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(f"postprocess: {error}")), flags=FINAL)

    def _abort(self, key):
        request = pb_utils.InferenceRequest(model_name=self.engine_model, requested_output_names=[],
                                            inputs=[pb_utils.Tensor("abort_request_key", bytes_tensor(key))])
        for response in request.exec(decoupled=True):
            if response.has_error():
                self.logger.log_error(f"flint_postprocess: abort of {key} failed: {response.error().message()}")

    def finalize(self):
        self.engine_watch.close()
