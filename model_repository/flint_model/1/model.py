"""flint_model: the engine, decoupled (flint_backend.serving.engine_host).

The engine runs on its own thread; `execute` hands requests over and returns at once;
outputs leave through the host's queue, which a response thread drains until the
sentinel; `finalize` stops the engine, then joins the response thread, then metrics.
"""

import json
import os
import sys
import threading
from pathlib import Path

# The Python backend's stub ignores PYTHONPATH; the launcher puts the project on it.
sys.path[:0] = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]

import triton_python_backend_utils as pb_utils  # noqa: E402

from flint_backend.engine.engine import LLMEngine  # noqa: E402
from flint_backend.serving import repository  # noqa: E402
from flint_backend.serving.chunks import chunk_arrays  # noqa: E402
from flint_backend.serving.engine_host import EngineHost  # noqa: E402
from flint_backend.serving.metrics import MetricsPublisher  # noqa: E402
from flint_backend.serving.tensors import scalar  # noqa: E402

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(config):
            raise pb_utils.TritonModelException("flint_model must be decoupled (model_transaction_policy)")
        self.logger = pb_utils.Logger
        self.input_names = [i["name"] for i in config["input"]]
        path = Path(args["model_repository"]) / args["model_version"] / repository.ENGINE_ARGS_FILE
        engine_args = repository.load_engine_args(path)
        self.logger.log_info(f"flint_model: engine args {engine_args.to_dict()}")
        self.host = EngineHost(LLMEngine(engine_args))
        labels = {"model": args["model_name"], "version": args["model_version"]}
        self.metrics = MetricsPublisher(pb_utils, self.host.engine.metrics, labels).start()
        self.response_thread = threading.Thread(target=self._response_loop, name="flint-responses", daemon=True)
        self.response_thread.start()

    def execute(self, requests):
        for request in requests:
            inputs = {}
            for name in self.input_names:
                tensor = pb_utils.get_input_tensor_by_name(request, name)
                if tensor is not None:
                    inputs[name] = tensor.as_numpy()
            sender = request.get_response_sender()
            if "abort_request_key" in inputs:  # control request
                self.host.abort(scalar(inputs, "abort_request_key"))
                sender.send(flags=FINAL)
            else:
                self.host.submit(sender, inputs)
        return None

    def _response_loop(self):
        for request, chunk in self.host.responses():
            flags = FINAL if chunk.finished else 0
            try:
                if self.host.poll_cancelled(request):
                    if chunk.finished:
                        request.handle.send(flags=FINAL)
                    continue
                tensors = [pb_utils.Tensor(name, array) for name, array in chunk_arrays(chunk).items()]
                request.handle.send(pb_utils.InferenceResponse(tensors), flags=flags)
            except Exception as error:  # the sender is gone: stop generating for it
                self.logger.log_error(f"flint_model: response for {chunk.key} failed: {error}")
                if not chunk.finished:
                    self.host.abort(chunk.key)

    def finalize(self):
        self.host.shutdown()
        self.response_thread.join()
        self.metrics.stop()
