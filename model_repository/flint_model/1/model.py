"""flint_model: the engine, decoupled (flint_backend.serving.engine_host).

One engine per Triton instance, on the device Triton placed the instance on (placement.py),
with its own KV pool; its metrics carry the label `instance`. The engine runs on its own
thread; `execute` hands requests over and returns at once; outputs leave through the host's
queue, which a response thread drains until the sentinel. An abort control request may
reach any instance: the relay forwards it to the owner (abort_relay.py). `finalize` stops
the engine, then joins the response thread, then the relay and the metrics. The parameter
`response_busy_fraction` paces responses when many streams run (response_pacing.py). Without a
`finalize` (tritonserver killed) or on SIGTERM, ParentWatch aborts everything and exits.
The engine lease tells flint_postprocess's watch whether this process stopped cleanly
(engine_lease.py): if it dies any other way, the server is stopped rather than left hanging.
"""

import dataclasses
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
from flint_backend.serving.abort_relay import AbortRelay  # noqa: E402
from flint_backend.serving.chunks import chunk_arrays  # noqa: E402
from flint_backend.serving.engine_host import EngineHost  # noqa: E402
from flint_backend.serving.engine_lease import EngineLease  # noqa: E402
from flint_backend.serving.metrics import MetricsPublisher  # noqa: E402
from flint_backend.serving.parent_watch import ParentWatch  # noqa: E402
from flint_backend.serving.placement import InstancePlacement  # noqa: E402
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
        placement = InstancePlacement.from_args(args)
        engine_args = repository.load_engine_args(path)
        engine_args = dataclasses.replace(engine_args, device=placement.engine_device(engine_args.device))
        self.logger.log_info(f"flint_model: instance {placement.name} (KIND_{placement.kind}), "
                             f"engine args {engine_args.to_dict()}")
        engine = LLMEngine(engine_args)
        if engine.warmup_s is not None:
            self.logger.log_info(f"flint_model: instance {placement.name} warmed up in {engine.warmup_s:.1f} s "
                                 "(a prefill step of each size class and two requests: Triton compiled their "
                                 "kernels)")
        self.relay = AbortRelay(placement.name, on_abort=lambda key: self.host.abort(key))
        self.host = EngineHost(engine, key_prefix=self.relay.key_prefix,
                               busy_fraction=repository.response_busy_fraction(repository.model_parameters(config)))
        labels = {"model": args["model_name"], "version": args["model_version"], "instance": placement.name}
        self.metrics = MetricsPublisher(pb_utils, self.host.engine.metrics, labels).start()
        self.response_thread = threading.Thread(target=self._response_loop, name="flint-responses", daemon=True)
        self.response_thread.start()
        self.lease = EngineLease()
        self.watch = ParentWatch(stop=self._stop, name=f"flint_model {placement.name}",
                                 on_orphaned=self.lease.drop).start()

    def execute(self, requests):
        for request in requests:
            inputs = {}
            for name in self.input_names:
                tensor = pb_utils.get_input_tensor_by_name(request, name)
                if tensor is not None:
                    inputs[name] = tensor.as_numpy()
            sender = request.get_response_sender()
            if "abort_request_key" in inputs:  # control request, for any instance's request
                self.relay.route(scalar(inputs, "abort_request_key"))
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
        self.watch.close()
        self.lease.release()
        self._stop()

    def _stop(self):
        self.host.shutdown()
        self.response_thread.join()
        self.relay.close()
        self.metrics.stop()
